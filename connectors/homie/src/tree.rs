//! What one Homie device published about itself, rebuilt from its MQTT topics (sans-I/O).
//!
//! The Connector subscribes to `<base>/<device-id>/#` and hands every message to
//! [`DeviceTree::ingest`]. Messages arrive in any order (retained ones all at once after a
//! subscription), so attributes are kept as they come and the description is assembled on
//! demand from the device's own lists: `$nodes` names the nodes, each node's `$properties`
//! names its properties. Anything not listed is ignored; nothing is assumed about a particular
//! device. Every level is bounded, so a misbehaving device cannot grow the Connector's memory.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::model::{Datatype, DeviceState, Format, PropertySpec, check_id};

/// Default base topic of the Homie convention.
pub const DEFAULT_BASE_TOPIC: &str = "homie";
/// The Homie major version this Connector speaks.
pub const HOMIE_MAJOR: &str = "4.";
/// Node attribute of the snapshot extension: the MIME type of the node's pictures.
pub const SNAPSHOT_ATTRIBUTE: &str = "$snapshot";
/// Extension id a device lists in `$extensions` when it implements snapshots.
pub const SNAPSHOT_EXTENSION: &str = "org.xagent.snapshot:1.0.0:[4.x]";

/// Most nodes kept per device.
pub const MAX_NODES: usize = 64;
/// Most properties kept per node.
pub const MAX_PROPERTIES: usize = 128;
/// Most attributes kept per device, node or property.
pub const MAX_ATTRIBUTES: usize = 32;
/// Longest attribute payload kept (bytes).
pub const MAX_ATTRIBUTE_LEN: usize = 1024;
/// Longest property value kept (bytes).
pub const MAX_VALUE_LEN: usize = 64 * 1024;

/// What a message meant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ingested {
    /// Nothing the Connector acts on (an attribute stored, an echo of a `/set`, an unknown or
    /// oversized topic).
    Nothing,
    /// `$state` changed (or was removed: `None`).
    State(Option<DeviceState>),
    /// An attribute that shapes the description changed (`$nodes`, `$properties`, ...).
    Description,
    /// A property published a value.
    Value {
        /// Node id.
        node: String,
        /// Property id.
        property: String,
        /// The payload as text.
        payload: String,
    },
    /// A picture answering a snapshot request (extension topic
    /// `<node>/$snapshot/image/<token>`).
    Snapshot {
        /// Node id.
        node: String,
        /// The request token.
        token: String,
        /// The picture.
        bytes: Vec<u8>,
    },
}

#[derive(Clone, Debug, Default)]
struct PropData {
    attrs: BTreeMap<String, String>,
    value: Option<String>,
}

#[derive(Clone, Debug, Default)]
struct NodeData {
    attrs: BTreeMap<String, String>,
    props: BTreeMap<String, PropData>,
}

/// One device's published topics.
#[derive(Clone, Debug, Default)]
pub struct DeviceTree {
    attrs: BTreeMap<String, String>,
    nodes: BTreeMap<String, NodeData>,
}

fn put_attr(map: &mut BTreeMap<String, String>, name: &str, payload: &str) -> bool {
    if payload.is_empty() {
        return map.remove(name).is_some();
    }
    if payload.len() > MAX_ATTRIBUTE_LEN || (!map.contains_key(name) && map.len() >= MAX_ATTRIBUTES)
    {
        return false;
    }
    map.insert(name.to_owned(), payload.to_owned());
    true
}

fn list(text: Option<&String>) -> Vec<&str> {
    text.map(|t| t.split(',').map(str::trim).filter(|s| !s.is_empty()).collect())
        .unwrap_or_default()
}

/// Why a device cannot be described yet.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the device has not published its full description yet: {0}")]
pub struct Incomplete(pub String);

/// A property as described, with its last value.
#[derive(Clone, Debug, PartialEq)]
pub struct PropertyDescription {
    /// Property id.
    pub id: String,
    /// The spec, or why it cannot be used (unknown datatype, bad format).
    pub spec: Result<PropertySpec, String>,
    /// Last published value (text), if any.
    pub value: Option<String>,
}

/// A node as described.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeDescription {
    /// Node id.
    pub id: String,
    /// `$name` (or the id).
    pub name: String,
    /// `$type`, if any.
    pub node_type: Option<String>,
    /// MIME type of snapshots, when the node implements the snapshot extension.
    pub snapshot: Option<String>,
    /// Properties in `$properties` order.
    pub properties: Vec<PropertyDescription>,
}

/// A device as described by its own attributes.
#[derive(Clone, Debug, PartialEq)]
pub struct Description {
    /// `$name` (or the id).
    pub name: String,
    /// `$homie` version.
    pub homie: String,
    /// `$state`.
    pub state: DeviceState,
    /// Nodes in `$nodes` order.
    pub nodes: Vec<NodeDescription>,
}

impl Description {
    /// The JSON the describe Tool returns (no device id, address or other binding facts).
    pub fn to_json(&self) -> Value {
        let nodes: Vec<Value> = self
            .nodes
            .iter()
            .map(|n| {
                let props: Vec<Value> = n
                    .properties
                    .iter()
                    .map(|p| match &p.spec {
                        Ok(spec) => spec.describe(&p.id, p.value.as_deref()),
                        Err(problem) => {
                            json!({"property": p.id, "usable": false, "problem": problem})
                        }
                    })
                    .collect();
                let mut v = json!({"node": n.id, "name": n.name, "properties": props});
                if let Some(t) = &n.node_type {
                    v["type"] = json!(t);
                }
                v["snapshot"] = json!(n.snapshot.is_some());
                v
            })
            .collect();
        json!({"name": self.name, "state": self.state.as_str(), "homie": self.homie, "nodes": nodes})
    }

    /// A node by id.
    pub fn node(&self, id: &str) -> Option<&NodeDescription> {
        self.nodes.iter().find(|n| n.id == id)
    }

    /// The last value a property published, if the device lists the property.
    pub fn value(&self, node: &str, property: &str) -> Option<&str> {
        self.node(node)?.properties.iter().find(|p| p.id == property)?.value.as_deref()
    }
}

impl DeviceTree {
    /// An empty tree.
    pub fn new() -> Self {
        Self::default()
    }

    /// Forgets everything (the broker connection was re-established; retained messages will
    /// be delivered again).
    pub fn clear(&mut self) {
        *self = Self::default();
    }

    /// Takes one message. `levels` are the topic levels after `<base>/<device-id>/`.
    pub fn ingest(&mut self, levels: &[&str], payload: &[u8]) -> Ingested {
        // Snapshot pictures are binary; everything else must be UTF-8.
        if let [node, "$snapshot", "image", token] = levels {
            if check_id(node).is_err() || check_id(token).is_err() {
                return Ingested::Nothing;
            }
            return Ingested::Snapshot {
                node: (*node).to_owned(),
                token: (*token).to_owned(),
                bytes: payload.to_vec(),
            };
        }
        let Ok(text) = std::str::from_utf8(payload) else { return Ingested::Nothing };
        match levels {
            [attr] if attr.starts_with('$') => {
                let before = self.attrs.get(*attr).cloned();
                if !put_attr(&mut self.attrs, attr, text) {
                    return Ingested::Nothing;
                }
                match *attr {
                    "$state"
                        if before.as_deref() != self.attrs.get("$state").map(String::as_str) =>
                    {
                        Ingested::State(self.attrs.get("$state").map(|s| DeviceState::parse(s)))
                    }
                    "$state" => Ingested::Nothing,
                    _ => Ingested::Description,
                }
            }
            [node, attr] if attr.starts_with('$') => {
                let Some(n) = self.node_mut(node) else { return Ingested::Nothing };
                if put_attr(&mut n.attrs, attr, text) {
                    Ingested::Description
                } else {
                    Ingested::Nothing
                }
            }
            [node, property] => {
                if check_id(property).is_err() || payload.len() > MAX_VALUE_LEN {
                    return Ingested::Nothing;
                }
                let Some(p) = self.prop_mut(node, property) else { return Ingested::Nothing };
                p.value = if text.is_empty() { None } else { Some(text.to_owned()) };
                Ingested::Value {
                    node: (*node).to_owned(),
                    property: (*property).to_owned(),
                    payload: text.to_owned(),
                }
            }
            [node, property, attr] if attr.starts_with('$') => {
                let Some(p) = self.prop_mut(node, property) else { return Ingested::Nothing };
                if put_attr(&mut p.attrs, attr, text) {
                    Ingested::Description
                } else {
                    Ingested::Nothing
                }
            }
            _ => Ingested::Nothing,
        }
    }

    fn node_mut(&mut self, node: &str) -> Option<&mut NodeData> {
        check_id(node).ok()?;
        if !self.nodes.contains_key(node) && self.nodes.len() >= MAX_NODES {
            return None;
        }
        Some(self.nodes.entry(node.to_owned()).or_default())
    }

    fn prop_mut(&mut self, node: &str, property: &str) -> Option<&mut PropData> {
        check_id(property).ok()?;
        let n = self.node_mut(node)?;
        if !n.props.contains_key(property) && n.props.len() >= MAX_PROPERTIES {
            return None;
        }
        Some(n.props.entry(property.to_owned()).or_default())
    }

    /// The device's `$state`, if published.
    pub fn state(&self) -> Option<DeviceState> {
        self.attrs.get("$state").map(|s| DeviceState::parse(s))
    }

    /// The device's `$name`, if published.
    pub fn name(&self) -> Option<&str> {
        self.attrs.get("$name").map(String::as_str)
    }

    /// Assembles the description from the device's own lists.
    pub fn description(&self) -> Result<Description, Incomplete> {
        let homie = self.attrs.get("$homie").ok_or_else(|| Incomplete("$homie".into()))?;
        if !homie.starts_with(HOMIE_MAJOR) {
            return Err(Incomplete(format!("$homie is {homie}, this Connector speaks 4.x")));
        }
        let state = self.state().ok_or_else(|| Incomplete("$state".into()))?;
        let node_ids = list(self.attrs.get("$nodes"));
        if !self.attrs.contains_key("$nodes") {
            return Err(Incomplete("$nodes".into()));
        }
        let mut nodes = Vec::new();
        for id in node_ids.into_iter().take(MAX_NODES) {
            if check_id(id).is_err() {
                continue;
            }
            let data = self.nodes.get(id);
            let attrs = data.map(|d| &d.attrs);
            let Some(props_attr) = attrs.and_then(|a| a.get("$properties")) else {
                return Err(Incomplete(format!("{id}/$properties")));
            };
            let mut properties = Vec::new();
            for pid in list(Some(props_attr)).into_iter().take(MAX_PROPERTIES) {
                if check_id(pid).is_err() {
                    continue;
                }
                let pdata = data.and_then(|d| d.props.get(pid));
                let Some(dt) = pdata.and_then(|p| p.attrs.get("$datatype")) else {
                    return Err(Incomplete(format!("{id}/{pid}/$datatype")));
                };
                let pattrs = pdata.map(|p| &p.attrs);
                let get = |k: &str| pattrs.and_then(|a| a.get(k)).map(String::as_str);
                let spec = match Datatype::parse(dt) {
                    None => Err(format!("datatype {dt} is not a Homie 4 datatype")),
                    Some(datatype) => match Format::parse(datatype, get("$format")) {
                        Err(e) => Err(e.to_string()),
                        Ok(format) => Ok(PropertySpec {
                            name: get("$name").unwrap_or(pid).to_owned(),
                            datatype,
                            format,
                            format_text: get("$format").map(str::to_owned),
                            settable: get("$settable") == Some("true"),
                            retained: get("$retained") != Some("false"),
                            unit: get("$unit").map(str::to_owned),
                        }),
                    },
                };
                properties.push(PropertyDescription {
                    id: pid.to_owned(),
                    spec,
                    value: pdata.and_then(|p| p.value.clone()),
                });
            }
            let attr = |k: &str| attrs.and_then(|a| a.get(k)).cloned();
            nodes.push(NodeDescription {
                id: id.to_owned(),
                name: attr("$name").unwrap_or_else(|| id.to_owned()),
                node_type: attr("$type"),
                snapshot: attr(SNAPSHOT_ATTRIBUTE),
                properties,
            });
        }
        Ok(Description {
            name: self.name().map(str::to_owned).unwrap_or_default(),
            homie: homie.clone(),
            state,
            nodes,
        })
    }
}

/// Splits a topic into the device id and the levels after it, for a base topic.
pub fn split_topic<'t>(base: &str, topic: &'t str) -> Option<(&'t str, Vec<&'t str>)> {
    let rest = topic.strip_prefix(base)?.strip_prefix('/')?;
    let mut levels = rest.split('/');
    let device = levels.next()?;
    check_id(device).ok()?;
    Some((device, levels.collect()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed(t: &mut DeviceTree, topic: &str, payload: &str) -> Ingested {
        let levels: Vec<&str> = topic.split('/').collect();
        t.ingest(&levels, payload.as_bytes())
    }

    fn thermostat() -> DeviceTree {
        let mut t = DeviceTree::new();
        // Out of order on purpose: retained messages come in any order.
        feed(&mut t, "thermostat/target/$datatype", "float");
        feed(&mut t, "thermostat/target/$format", "16:30");
        feed(&mut t, "thermostat/target/$settable", "true");
        feed(&mut t, "thermostat/target", "21.5");
        feed(&mut t, "$homie", "4.0.0");
        feed(&mut t, "$name", "Hall");
        feed(&mut t, "$nodes", "thermostat,camera");
        feed(&mut t, "thermostat/$properties", "target,mode");
        feed(&mut t, "thermostat/mode/$datatype", "enum");
        feed(&mut t, "thermostat/mode/$format", "off,heat");
        feed(&mut t, "camera/$properties", "resolution");
        feed(&mut t, "camera/resolution/$datatype", "string");
        feed(&mut t, "camera/$snapshot", "image/png");
        t
    }

    #[test]
    fn description_follows_the_devices_own_lists() {
        let mut t = thermostat();
        assert_eq!(t.description().unwrap_err(), Incomplete("$state".into()));
        assert_eq!(feed(&mut t, "$state", "ready"), Ingested::State(Some(DeviceState::Ready)));
        let d = t.description().unwrap();
        assert_eq!(d.nodes.len(), 2);
        let target = &d.nodes[0].properties[0];
        let spec = target.spec.as_ref().unwrap();
        assert!(spec.settable);
        assert_eq!(target.value.as_deref(), Some("21.5"));
        assert!(!d.nodes[0].properties[1].spec.as_ref().unwrap().settable);
        assert_eq!(d.nodes[1].snapshot.as_deref(), Some("image/png"));
        let j = d.to_json();
        assert_eq!(j["nodes"][0]["properties"][0]["value"], json!(21.5));
        assert_eq!(j["nodes"][0]["properties"][0]["format"], json!({"min": 16.0, "max": 30.0}));
        // A node listed later but not described yet makes the description incomplete.
        feed(&mut t, "$nodes", "thermostat,camera,extra");
        assert_eq!(t.description().unwrap_err(), Incomplete("extra/$properties".into()));
    }

    #[test]
    fn unknown_datatypes_are_flagged_not_fatal() {
        let mut t = thermostat();
        feed(&mut t, "$state", "ready");
        feed(&mut t, "thermostat/mode/$datatype", "quaternion");
        let d = t.description().unwrap();
        assert!(d.nodes[0].properties[1].spec.is_err());
        assert_eq!(d.to_json()["nodes"][0]["properties"][1]["usable"], json!(false));
    }

    #[test]
    fn homie_3_devices_are_not_described() {
        let mut t = thermostat();
        feed(&mut t, "$state", "ready");
        feed(&mut t, "$homie", "3.0.1");
        assert!(t.description().is_err());
    }

    #[test]
    fn state_changes_and_values_are_reported_once() {
        let mut t = thermostat();
        assert_eq!(feed(&mut t, "$state", "ready"), Ingested::State(Some(DeviceState::Ready)));
        assert_eq!(feed(&mut t, "$state", "ready"), Ingested::Nothing);
        assert_eq!(feed(&mut t, "$state", "lost"), Ingested::State(Some(DeviceState::Lost)));
        assert_eq!(feed(&mut t, "$state", ""), Ingested::State(None));
        assert_eq!(
            feed(&mut t, "thermostat/target", "22.0"),
            Ingested::Value {
                node: "thermostat".into(),
                property: "target".into(),
                payload: "22.0".into()
            }
        );
        assert_eq!(feed(&mut t, "thermostat/target/set", "22.0"), Ingested::Nothing);
    }

    #[test]
    fn snapshot_pictures_are_binary() {
        let mut t = DeviceTree::new();
        let got = t.ingest(&["camera", "$snapshot", "image", "tok-1"], &[0x89, 0x50, 0xff]);
        assert_eq!(
            got,
            Ingested::Snapshot {
                node: "camera".into(),
                token: "tok-1".into(),
                bytes: vec![0x89, 0x50, 0xff]
            }
        );
        assert_eq!(t.ingest(&["camera", "$snapshot", "request"], b"tok-1"), Ingested::Nothing);
    }

    #[test]
    fn rule_a_flooding_device_is_bounded() {
        let mut t = DeviceTree::new();
        for i in 0..(MAX_NODES + 10) {
            feed(&mut t, &format!("n{i}/$name"), "x");
        }
        assert_eq!(t.nodes.len(), MAX_NODES);
        for i in 0..(MAX_PROPERTIES + 10) {
            feed(&mut t, &format!("n0/p{i}"), "1");
        }
        assert_eq!(t.nodes["n0"].props.len(), MAX_PROPERTIES);
        let big = "x".repeat(MAX_ATTRIBUTE_LEN + 1);
        assert_eq!(feed(&mut t, "$name", &big), Ingested::Nothing);
        assert_eq!(feed(&mut t, "N0/$name", "bad id"), Ingested::Nothing);
        assert_eq!(t.ingest(&["$name"], &[0xff, 0xfe]), Ingested::Nothing);
    }

    #[test]
    fn topics_split_into_device_and_levels() {
        assert_eq!(
            split_topic("homie", "homie/dev-1/node/prop/$datatype"),
            Some(("dev-1", vec!["node", "prop", "$datatype"]))
        );
        assert_eq!(split_topic("homie", "other/dev/x"), None);
        assert_eq!(split_topic("homie", "homie/BAD/x"), None);
    }
}
