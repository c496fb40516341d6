//! A device's description pinned when a channel binds it (sans-I/O).
//!
//! Anyone who can publish on the broker can rewrite a device's retained attributes: widen a
//! `$format` range, turn `$settable` on for a sensor, change a datatype or the snapshot MIME
//! type. So the Connector does not take those from the broker at every call: it records the
//! description the device published when the channel bound it ([`Pinned`], kept with the
//! channel's binding) and judges every read, set and snapshot against that record. Values still
//! come from the broker. A device whose description changed later keeps working as pinned; the
//! describe Tool says `description_changed: true`, and the change takes effect only when the
//! channel binds the device again (`homie_bind`).

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::HomieError;
use crate::model::{Datatype, Format, PropertySpec};
use crate::tree::{Description, PropertyDescription};

/// Largest pinned description kept with a binding (its JSON, bytes): bounds what a device can
/// make the Connector store per channel.
pub const MAX_PINNED_BYTES: usize = 256 * 1024;

/// MIME types a snapshot may have: images only (a device cannot make the Connector serve HTML
/// or scripts from its Transfer Plane).
pub const SNAPSHOT_MIME_TYPES: &[&str] = &["image/png", "image/jpeg", "image/gif", "image/webp"];

/// A property as pinned: the raw attributes the device published for it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PinnedProperty {
    /// Property id.
    pub id: String,
    /// `$name` (or the id).
    pub name: String,
    /// `$datatype`.
    pub datatype: String,
    /// `$format`, when published.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<String>,
    /// `$settable`.
    pub settable: bool,
    /// `$retained`.
    pub retained: bool,
    /// `$unit`, when published.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unit: Option<String>,
}

/// A node as pinned.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PinnedNode {
    /// Node id.
    pub id: String,
    /// `$name` (or the id).
    pub name: String,
    /// `$type`, when published.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_type: Option<String>,
    /// The snapshot MIME type the node declared (checked against [`SNAPSHOT_MIME_TYPES`] when
    /// a snapshot is taken).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<String>,
    /// Usable properties in `$properties` order (unusable ones are not pinned).
    pub properties: Vec<PinnedProperty>,
}

/// A device's description as pinned at bind time.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pinned {
    /// `$name`.
    pub name: String,
    /// `$homie` version.
    pub homie: String,
    /// Nodes in `$nodes` order.
    pub nodes: Vec<PinnedNode>,
}

fn pin_property(p: &PropertyDescription) -> Option<PinnedProperty> {
    let spec = p.spec.as_ref().ok()?;
    Some(PinnedProperty {
        id: p.id.clone(),
        name: spec.name.clone(),
        datatype: spec.datatype.as_str().to_owned(),
        format: spec.format_text.clone(),
        settable: spec.settable,
        retained: spec.retained,
        unit: spec.unit.clone(),
    })
}

impl Pinned {
    /// Pins what a device describes now.
    pub fn of(description: &Description) -> Self {
        Self {
            name: description.name.clone(),
            homie: description.homie.clone(),
            nodes: description
                .nodes
                .iter()
                .map(|n| PinnedNode {
                    id: n.id.clone(),
                    name: n.name.clone(),
                    node_type: n.node_type.clone(),
                    snapshot: n.snapshot.clone(),
                    properties: n.properties.iter().filter_map(pin_property).collect(),
                })
                .collect(),
        }
    }

    /// The JSON kept with the binding; refused when larger than [`MAX_PINNED_BYTES`].
    pub fn to_text(&self) -> Result<String, HomieError> {
        let text = serde_json::to_string(self).map_err(|e| HomieError::NotPinned(e.to_string()))?;
        if text.len() > MAX_PINNED_BYTES {
            return Err(HomieError::NotPinned(format!(
                "the device's description is larger than {MAX_PINNED_BYTES} bytes"
            )));
        }
        Ok(text)
    }

    /// Reads the JSON kept with a binding.
    pub fn from_text(text: &str) -> Result<Self, HomieError> {
        if text.len() > MAX_PINNED_BYTES {
            return Err(HomieError::NotPinned("the pinned description is too large".into()));
        }
        serde_json::from_str(text).map_err(|e| HomieError::NotPinned(e.to_string()))
    }

    /// A pinned node.
    pub fn node(&self, node: &str) -> Result<&PinnedNode, HomieError> {
        self.nodes
            .iter()
            .find(|n| n.id == node)
            .ok_or_else(|| HomieError::NoSuchNode(node.chars().take(64).collect()))
    }

    /// A pinned property's spec: what a read, a set and its confirmation are judged by.
    pub fn spec(&self, node: &str, property: &str) -> Result<PropertySpec, HomieError> {
        let n = self.node(node)?;
        let p = n.properties.iter().find(|p| p.id == property).ok_or_else(|| {
            HomieError::NoSuchProperty {
                node: node.to_owned(),
                property: property.chars().take(64).collect(),
            }
        })?;
        let unusable = |problem: String| HomieError::Unusable {
            node: node.to_owned(),
            property: property.to_owned(),
            problem,
        };
        let datatype = Datatype::parse(&p.datatype)
            .ok_or_else(|| unusable(format!("datatype {} is unknown", p.datatype)))?;
        let format =
            Format::parse(datatype, p.format.as_deref()).map_err(|e| unusable(e.to_string()))?;
        Ok(PropertySpec {
            name: p.name.clone(),
            datatype,
            format,
            format_text: p.format.clone(),
            settable: p.settable,
            retained: p.retained,
            unit: p.unit.clone(),
        })
    }

    /// The describe Tool's JSON: the pinned structure with the live `$state` and last values
    /// (typed by the pinned datatypes), and `description_changed` when the device now
    /// describes itself differently.
    pub fn to_json(&self, live: &Description) -> Value {
        let nodes: Vec<Value> = self
            .nodes
            .iter()
            .map(|n| {
                let mut props: Vec<Value> = n
                    .properties
                    .iter()
                    .filter_map(|p| {
                        let spec = self.spec(&n.id, &p.id).ok()?;
                        Some(spec.describe(&p.id, live.value(&n.id, &p.id)))
                    })
                    .collect();
                // Properties the device describes in a way this Connector cannot use are shown
                // as such (they are never pinned, so no call reaches them).
                let unusable = live.node(&n.id).into_iter().flat_map(|live| &live.properties);
                for p in unusable {
                    if let Err(problem) = &p.spec {
                        props.push(json!({"property": p.id, "usable": false, "problem": problem}));
                    }
                }
                let mut v = json!({"node": n.id, "name": n.name, "properties": props});
                if let Some(t) = &n.node_type {
                    v["type"] = json!(t);
                }
                v["snapshot"] =
                    json!(n.snapshot.as_deref().is_some_and(|m| snapshot_mime(m).is_ok()));
                v
            })
            .collect();
        let mut out = json!({
            "name": self.name,
            "state": live.state.as_str(),
            "homie": self.homie,
            "nodes": nodes,
        });
        if Pinned::of(live) != *self {
            out["description_changed"] = json!(true);
            out["note"] = json!(
                "the device now describes itself differently from when it was bound; this channel still uses the description it bound (bind the device again with homie_bind to take the new one)"
            );
        }
        out
    }
}

/// Checks a declared snapshot MIME type against [`SNAPSHOT_MIME_TYPES`]; returns the
/// canonical type.
pub fn snapshot_mime(declared: &str) -> Result<&'static str, HomieError> {
    let wanted = declared.trim().to_ascii_lowercase();
    SNAPSHOT_MIME_TYPES.iter().copied().find(|m| *m == wanted).ok_or_else(|| {
        HomieError::BadSnapshot(format!(
            "the device declares snapshots of type {:?}; only {} are accepted",
            declared.chars().take(64).collect::<String>(),
            SNAPSHOT_MIME_TYPES.join(", ")
        ))
    })
}

/// Checks that a picture's bytes are of its (allowed) MIME type, by their signature.
pub fn check_picture(mime: &str, bytes: &[u8]) -> Result<(), HomieError> {
    let ok = match mime {
        "image/png" => bytes.starts_with(b"\x89PNG\r\n\x1a\n"),
        "image/jpeg" => bytes.starts_with(&[0xff, 0xd8, 0xff]),
        "image/gif" => bytes.starts_with(b"GIF87a") || bytes.starts_with(b"GIF89a"),
        "image/webp" => bytes.len() >= 12 && &bytes[..4] == b"RIFF" && &bytes[8..12] == b"WEBP",
        _ => false,
    };
    if ok {
        Ok(())
    } else {
        Err(HomieError::BadSnapshot(format!("the picture the device sent is not {mime}")))
    }
}

/// The file name extension of an allowed snapshot MIME type.
pub fn snapshot_extension(mime: &str) -> &'static str {
    match mime {
        "image/jpeg" => "jpg",
        "image/gif" => "gif",
        "image/webp" => "webp",
        _ => "png",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tree::DeviceTree;

    fn device(format: &str, extra: Option<(&str, &str)>) -> Description {
        let mut t = DeviceTree::new();
        let mut feed = |topic: &str, payload: &str| {
            let levels: Vec<&str> = topic.split('/').collect();
            t.ingest(&levels, payload.as_bytes());
        };
        feed("$homie", "4.0.0");
        feed("$state", "ready");
        feed("$nodes", "t");
        feed("t/$properties", "target,odd");
        feed("t/target/$datatype", "float");
        feed("t/target/$format", format);
        feed("t/target/$settable", "true");
        feed("t/target", "21.5");
        feed("t/odd/$datatype", "quaternion");
        if let Some((topic, payload)) = extra {
            feed(topic, payload);
        }
        t.description().unwrap()
    }

    #[test]
    fn pinned_description_judges_calls_and_shows_drift() {
        let pinned = Pinned::of(&device("16:30", None));
        let back = Pinned::from_text(&pinned.to_text().unwrap()).unwrap();
        assert_eq!(back, pinned);
        let spec = pinned.spec("t", "target").unwrap();
        assert!(spec.payload_for(&json!(31)).is_err());
        assert!(matches!(pinned.spec("t", "odd"), Err(HomieError::NoSuchProperty { .. })));
        // Unchanged: no drift; the unusable property is shown, not pinned.
        let same = pinned.to_json(&device("16:30", None));
        assert!(same.get("description_changed").is_none(), "{same}");
        assert_eq!(same["nodes"][0]["properties"][0]["value"], json!(21.5));
        assert_eq!(same["nodes"][0]["properties"][1]["usable"], json!(false));
        // Widened on the broker: still judged by the pinned range, and the change is shown.
        let wide = pinned.to_json(&device("0:200", None));
        assert_eq!(wide["description_changed"], true);
        assert_eq!(wide["nodes"][0]["properties"][0]["format"], json!({"min": 16.0, "max": 30.0}));
        assert!(Pinned::from_text("{not json").is_err());
    }

    #[test]
    fn snapshot_mime_type_must_be_an_image() {
        assert_eq!(snapshot_mime("image/png").unwrap(), "image/png");
        assert_eq!(snapshot_mime(" Image/JPEG ").unwrap(), "image/jpeg");
        for bad in ["text/html", "image/svg+xml", "application/octet-stream", ""] {
            let err = snapshot_mime(bad).unwrap_err();
            assert!(err.to_string().contains("image/png"), "{err}");
        }
        check_picture("image/png", b"\x89PNG\r\n\x1a\nrest").unwrap();
        assert!(check_picture("image/png", b"<html><script>").is_err());
        assert!(check_picture("image/jpeg", b"\x89PNG\r\n\x1a\n").is_err());
    }
}
