//! [`ConnectorBuilder::build`]: checks what the author registered and assembles the
//! definition and its Card (validated like `xagent-connector check` and xAgent's admission).

use std::collections::HashMap;

use xagent_profile_device::{DeviceTool, RiskLevel, ToolCategory, unsafe_arguments};
use xagent_protocol_types::{
    AuthFlow, CardTool, ConnectorCard, DescriptorTarget, PROFILE_DEVICE_V1, Supports, TargetType,
    ToolId,
};

use super::{Connector, ConnectorBuilder, PendingFlow};
use crate::error::DefinitionError;

impl<S> ConnectorBuilder<S> {
    /// Checks and assembles the definition.
    pub fn build(mut self) -> Result<Connector, DefinitionError> {
        if let Some(error) = self.errors.drain(..).next() {
            return Err(error);
        }
        let mut supports = Supports::new(self.target_types.clone(), self.profiles.clone());
        supports.targets = self.targets.clone();
        supports.user_channel_mode = self.user_channel_mode.clone();
        let mut card = ConnectorCard::new(self.card_id.clone(), self.build, self.info, supports);
        let default_profile = self.profiles.first().cloned();
        let mut tools = HashMap::default();
        for mut tool in self.tools {
            if tool.card.profile.is_none() {
                tool.card.profile = default_profile.clone();
            }
            card.tools.push(tool.card.clone());
            tools.insert(tool.card.tool_id.clone(), tool);
        }
        let target_type = self.target_types.first().cloned().unwrap_or(TargetType::Im);
        card.auth_flows = self
            .flows
            .into_iter()
            .map(|flow| match flow {
                PendingFlow::Declared(flow) => *flow,
                PendingFlow::Qr(spec) => {
                    let target_type = spec.target_type.clone().unwrap_or(target_type.clone());
                    spec.qr(target_type)
                }
                PendingFlow::Form(spec, fields) => spec.declare(AuthFlow::form(
                    spec.id.clone(),
                    spec.target_type.clone().unwrap_or(target_type.clone()),
                    spec.title.clone(),
                    fields,
                )),
            })
            .collect();
        card.ui = self.ui;
        card.security = self.security;
        let im_profile =
            self.profiles.iter().find(|p| p.as_str() == xagent_protocol_types::PROFILE_IM_V2);
        if let (Some(profile), None) = (im_profile, &self.im) {
            return Err(DefinitionError::MissingImTarget(profile.to_string()));
        }
        let unbound_target = match self.targets.first() {
            Some(target) => DescriptorTarget::new(
                target.provider.clone(),
                format!("{} not bound", target.label),
            )
            .with_label(target.label.clone()),
            None => DescriptorTarget::new(card.connector_card_id.to_string(), "not bound"),
        };
        let card_value = check_card(&card)?;
        check_skill(self.skill.as_deref(), &card_value)?;
        check_device_arguments(&card, &self.device_tools, &self.unconstrained)?;
        let device = match (self.device, self.device_tools.is_empty()) {
            (None, true) => None,
            (None, false) => {
                return Err(DefinitionError::MissingDeviceTarget);
            }
            (Some((code, config)), _) => {
                let mut declared = Vec::new();
                for (tool_id, category, risk) in self.device_tools {
                    let schema = tools
                        .get(&tool_id)
                        .map(|t| t.card.input_schema.clone())
                        .unwrap_or_default();
                    let tool = DeviceTool::from_schema(tool_id, category, risk, &schema)?;
                    declared.push(tool);
                }
                Some(crate::device::DeviceDef { code, tools: declared, config })
            }
        };
        Ok(Connector {
            device,
            card,
            tools,
            auth: self.auth,
            im: self.im,
            skill: self.skill,
            unbound_target,
        })
    }
}

/// Device v1 on argument schemas: no device Tool (declared with
/// [`ConnectorBuilder::device_tool`], or any Tool of the `xagent.device.v1` Profile) may let
/// the model pass an unconstrained command or file bytes, except where the operator opted out
/// for that Tool and property ([`ConnectorBuilder::allow_unconstrained_device_argument`]).
fn check_device_arguments(
    card: &ConnectorCard,
    device_tools: &[(ToolId, ToolCategory, RiskLevel)],
    allowed: &[(ToolId, String)],
) -> Result<(), DefinitionError> {
    let is_device_tool = |tool: &CardTool| {
        device_tools.iter().any(|(id, _, _)| id == &tool.tool_id)
            || tool.profile.as_ref().is_some_and(|p| p.as_str() == PROFILE_DEVICE_V1)
    };
    for tool in card.tools.iter().filter(|t| is_device_tool(t)) {
        for finding in unsafe_arguments(&tool.tool_id, &tool.input_schema) {
            let opted_out = allowed
                .iter()
                .any(|(id, property)| id == &finding.tool && property == &finding.property);
            if !opted_out {
                return Err(DefinitionError::UnsafeDeviceArgument(finding));
            }
            tracing::warn!(
                tool = %finding.tool,
                property = %finding.property,
                rule = finding.rule.id(),
                "the operator allowed an unconstrained device Tool argument"
            );
        }
    }
    Ok(())
}

/// Runs the protocol's Card validator on the serialised Card: every `error` violation refuses
/// the definition, warnings are logged.
fn check_card(card: &ConnectorCard) -> Result<serde_json::Value, DefinitionError> {
    let value = serde_json::to_value(card)?;
    let report = xagent_protocol_validate::validate_card(&value);
    for warning in report.warnings() {
        tracing::warn!(rule = %warning.rule, path = %warning.path, "Connector Card: {}", warning.message);
    }
    let errors: Vec<_> = report.errors().cloned().collect();
    if errors.is_empty() { Ok(value) } else { Err(DefinitionError::CardViolations(errors)) }
}

/// Runs the protocol's Skill validator (the one `xagent-connector check skill` and xAgent's
/// admission use) on the primary Skill, or, when the Connector serves none, the check that no
/// Tool relates a Skill (`skill.related_skill_ids`): errors refuse the definition, warnings are
/// logged.
fn check_skill(skill: Option<&str>, card: &serde_json::Value) -> Result<(), DefinitionError> {
    let facts = xagent_protocol_validate::CardFacts::from_value(card);
    let validator = xagent_protocol_validate::Validator::default();
    let report = match skill {
        Some(skill) => validator.skill(skill, &facts),
        None => validator.absent_skill(&facts),
    };
    for warning in report.warnings() {
        tracing::warn!(rule = %warning.rule, path = %warning.path, "Skill: {}", warning.message);
    }
    let errors: Vec<_> = report.errors().cloned().collect();
    if errors.is_empty() { Ok(()) } else { Err(DefinitionError::SkillViolations(errors)) }
}
