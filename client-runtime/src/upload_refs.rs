//! Upload-reference arguments of Card Tools (SPEC-NOTES, "Upload-reference arguments"): which
//! properties carry one, and the model-facing schema that shows them as a unified file
//! reference. Pure functions, used by the Tool projection and by `tool.invoke`.

use serde_json::{Map, Value, json};

/// The annotation that marks a Card Tool property as an internal upload reference
/// (SPEC-NOTES, "Upload-reference arguments").
pub const UPLOAD_REF_ANNOTATION: &str = "x-xagent-upload-ref";

/// Where each upload-reference argument of a Tool is: a property, or the items of an array
/// property.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UploadRefProperty {
    /// The property name.
    pub name: String,
    /// True when the property is an array of references.
    pub array: bool,
}

fn is_upload_ref(schema: &Value) -> bool {
    schema.get(UPLOAD_REF_ANNOTATION).and_then(Value::as_bool) == Some(true)
}

/// The upload-reference properties of a Tool's `input_schema`.
pub fn upload_ref_properties(input_schema: &Map<String, Value>) -> Vec<UploadRefProperty> {
    let Some(properties) = input_schema.get("properties").and_then(Value::as_object) else {
        return Vec::new();
    };
    properties
        .iter()
        .filter_map(|(name, schema)| {
            if is_upload_ref(schema) {
                Some(UploadRefProperty { name: name.clone(), array: false })
            } else if schema.get("items").is_some_and(is_upload_ref) {
                Some(UploadRefProperty { name: name.clone(), array: true })
            } else {
                None
            }
        })
        .collect()
}

/// The model's view of an upload reference. The Card's own description is not kept: it is
/// written for the Connector's internal reference and may mention the Transfer Plane.
fn unified_file_ref() -> Value {
    json!({
        "type": "string",
        "description": "A file from the conversation: pass its file reference unchanged.",
    })
}

/// The model-facing schema of a Card Tool: every upload-reference property (or array items)
/// becomes a unified file reference without the annotation; everything else is unchanged.
pub fn model_input_schema(input_schema: &Map<String, Value>) -> Map<String, Value> {
    let mut projected = input_schema.clone();
    let Some(properties) = projected.get_mut("properties").and_then(Value::as_object_mut) else {
        return projected;
    };
    for schema in properties.values_mut() {
        if is_upload_ref(schema) {
            *schema = unified_file_ref();
        } else if let Some(items) = schema.get_mut("items")
            && is_upload_ref(items)
        {
            *items = unified_file_ref();
        }
    }
    projected
}
