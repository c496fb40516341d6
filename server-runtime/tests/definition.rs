//! `Connector::builder(..).build()` refuses a definition whose generated Card breaks a hard
//! rule: the Card validator (`xagent_protocol_validate::validate_card`) runs there, so a
//! Connector can never serve such a Card.

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;
use xagent_protocol_types::{
    AuthField, AuthFlow, PROFILE_DEVICE_V1, PROFILE_IM_V1, TargetDeclaration, TargetType,
};
use xagent_protocol_validate::validate_card;
use xagent_server_runtime::{
    AuthContext, AuthError, AuthStep, AuthValues, Connector, ConnectorBuilder, DefinitionError,
    FlowHandler, ToolContext, ToolSpec,
};
use xagent_testkit::echo_connector;

struct Refuse;

impl FlowHandler for Refuse {
    async fn start(&self, _ctx: AuthContext, _input: AuthValues) -> Result<AuthStep, AuthError> {
        Ok(AuthStep::Failed("no".into()))
    }
}

#[derive(Deserialize, JsonSchema)]
struct Nothing {}

fn base() -> ConnectorBuilder {
    Connector::builder("im.definition", "Definition", "1.0.0")
        .target(TargetDeclaration::new(TargetType::Im, "def", "Def"))
        .profile(PROFILE_IM_V1)
}

/// The rule ids of a `CardViolations` error (panics on any other outcome).
fn violated_rules(result: Result<Connector, DefinitionError>) -> Vec<String> {
    match result {
        Err(DefinitionError::CardViolations(violations)) => {
            assert!(!violations.is_empty());
            violations.into_iter().map(|v| v.rule).collect()
        }
        Err(other) => panic!("expected CardViolations, got {other}"),
        Ok(connector) => panic!("the invalid Card was accepted: {:?}", connector.card()),
    }
}

#[test]
fn rule_card_auth_form_fields_a_form_flow_without_fields_is_refused_at_build() {
    let result = base()
        .auth_flow_with(AuthFlow::form("empty_form", TargetType::Im, "Sign in", vec![]), Refuse)
        .build();
    let rules = violated_rules(result);
    assert_eq!(rules, vec!["card.auth_form_fields".to_owned()]);
}

#[test]
fn rule_card_auth_field_name_unique_duplicate_form_fields_are_refused_at_build() {
    let fields = vec![AuthField::text("user", "User"), AuthField::text("user", "User again")];
    let result = base()
        .auth_flow_with(AuthFlow::form("dup", TargetType::Im, "Sign in", fields), Refuse)
        .build();
    assert!(violated_rules(result).contains(&"card.auth_field_name_unique".to_owned()));
}

#[test]
fn rule_card_profile_target_type_a_profile_must_fit_the_declared_target_types() {
    // The Device Profile on an IM-only Connector.
    let result = base().profile(PROFILE_DEVICE_V1).build();
    assert!(violated_rules(result).contains(&"card.profile_target_type".to_owned()));
}

#[test]
fn rule_card_profiles_a_connector_without_profiles_is_refused_at_build() {
    let result = Connector::builder("im.none", "None", "1.0.0")
        .target(TargetDeclaration::new(TargetType::Im, "none", "None"))
        .build();
    assert!(violated_rules(result).contains(&"card.profiles".to_owned()));
}

#[test]
fn rule_card_connector_name_and_version_are_required_at_build() {
    let rules = violated_rules(base_named("", "").build());
    assert!(rules.contains(&"card.connector_name".to_owned()), "{rules:?}");
    assert!(rules.contains(&"card.connector_version".to_owned()), "{rules:?}");
}

fn base_named(name: &str, version: &str) -> ConnectorBuilder {
    Connector::builder("im.definition", name, version)
        .target(TargetDeclaration::new(TargetType::Im, "def", "Def"))
        .profile(PROFILE_IM_V1)
}

#[test]
fn rule_card_secret_leak_a_card_carrying_a_secret_is_refused_at_build() {
    let result = base()
        .description("Bearer sk-live-0123456789abcdef0123456789abcdef is the admin key")
        .build();
    let error = match result {
        Err(error) => error,
        Ok(_) => panic!("a Card with a key in it was accepted"),
    };
    assert!(
        matches!(&error, DefinitionError::CardViolations(v) if v.iter().any(|v| v.rule == "card.secret_leak")),
        "{error}"
    );
    // The error message itself never repeats the secret.
    assert!(!error.to_string().contains("0123456789abcdef0123456789abcdef"), "{error}");
}

#[test]
fn rule_card_tool_id_format_a_tool_id_with_spaces_is_refused_at_build() {
    let result = base()
        .tool::<Nothing, _, _, _>(
            ToolSpec::new("send message", concat!("Send", "\n", "Sends.")),
            |_ctx: ToolContext, _a| async { Ok(json!({})) },
        )
        .build();
    assert!(matches!(result, Err(DefinitionError::BadToolId(id)) if id == "send message"));
}

#[test]
fn rule_card_tool_id_unique_two_tools_with_one_id_are_refused_at_build() {
    let tool = |_ctx: ToolContext, _a: Nothing| async { Ok(json!({})) };
    let result = base()
        .tool::<Nothing, _, _, _>(ToolSpec::new("same", concat!("A", "\n", "First.")), tool)
        .tool::<Nothing, _, _, _>(ToolSpec::new("same", concat!("B", "\n", "Second.")), tool)
        .build();
    assert!(matches!(result, Err(DefinitionError::DuplicateTool(id)) if id == "same"));
}

#[test]
fn valid_definitions_build_and_their_cards_have_no_error_violation() {
    let (echo, _) = echo_connector();
    let card = serde_json::to_value(echo.card()).unwrap();
    let report = validate_card(&card);
    assert!(report.valid, "{:?}", report.violations);
    let qr = base()
        .auth_flow_with(AuthFlow::qr_login("qr", TargetType::Im, "Scan"), Refuse)
        .build()
        .unwrap();
    assert!(validate_card(&serde_json::to_value(qr.card()).unwrap()).valid);
}
