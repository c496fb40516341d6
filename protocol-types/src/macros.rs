//! Small declarative macros that keep the many string-valued wire types uniform.

/// Implements `JsonSchema` for a type whose schema is one fixed JSON value; `inline = true`
/// writes it in place, `false` gives it a named definition.
macro_rules! fixed_schema {
    ($name:ident, inline = $inline:literal, $($schema:tt)+) => {
        impl schemars::JsonSchema for $name {
            fn inline_schema() -> bool {
                $inline
            }
            fn schema_name() -> std::borrow::Cow<'static, str> {
                stringify!($name).into()
            }
            fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
                schemars::json_schema!($($schema)+)
            }
        }
    };
}

/// Declares an opaque identifier newtype: transparent on the wire, a plain string in schemas.
macro_rules! id_newtype {
    ($(#[$meta:meta])* $name:ident) => {
        $(#[$meta])*
        #[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
        #[serde(transparent)]
        pub struct $name(String);

        impl $name {
            /// Wraps a string without checking it; IDs are opaque on the wire.
            pub fn new(value: impl Into<String>) -> Self {
                Self(value.into())
            }
            /// The identifier as it appears on the wire.
            pub fn as_str(&self) -> &str {
                &self.0
            }
            /// Consumes the identifier and returns the wire string.
            pub fn into_string(self) -> String {
                self.0
            }
            /// True when the identifier is the empty string (allowed only where the spec says so).
            pub fn is_empty(&self) -> bool {
                self.0.is_empty()
            }
        }

        impl std::fmt::Debug for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "{}({:?})", stringify!($name), self.0)
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl std::borrow::Borrow<str> for $name {
            fn borrow(&self) -> &str {
                &self.0
            }
        }

        impl From<String> for $name {
            fn from(value: String) -> Self {
                Self(value)
            }
        }

        impl From<&str> for $name {
            fn from(value: &str) -> Self {
                Self(value.to_owned())
            }
        }

        impl From<$name> for String {
            fn from(value: $name) -> Self {
                value.0
            }
        }

        impl PartialEq<str> for $name {
            fn eq(&self, other: &str) -> bool {
                self.0 == other
            }
        }

        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                self.0 == *other
            }
        }

        fixed_schema!($name, inline = true, { "type": "string" });
    };
}

/// Declares a set of named wire values with an `Other` fallback, so a newer peer's value is
/// reported by the validator instead of failing the parse. Schemas list only the known values:
/// we never emit anything else.
macro_rules! open_enum {
    (
        $(#[$meta:meta])*
        $name:ident {
            $( $(#[$vmeta:meta])* $variant:ident = $wire:literal ),+ $(,)?
        }
    ) => {
        open_enum!(@define [$(#[$meta])*] $name { $( [$(#[$vmeta])*] $variant = $wire ),+ });

        fixed_schema!($name, inline = false, { "type": "string", "enum": [$($wire),+] });
    };
    (
        @open_set
        $(#[$meta:meta])*
        $name:ident {
            $( $(#[$vmeta:meta])* $variant:ident = $wire:literal ),+ $(,)?
        }
    ) => {
        open_enum!(@define [$(#[$meta])*] $name { $( [$(#[$vmeta])*] $variant = $wire ),+ });

        fixed_schema!(
            $name,
            inline = true,
            { "type": "string", "minLength": 1, "examples": [$($wire),+] }
        );
    };
    (
        @define [$(#[$meta:meta])*] $name:ident {
            $( [$(#[$vmeta:meta])*] $variant:ident = $wire:literal ),+
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, PartialEq, Eq, Hash)]
        #[non_exhaustive]
        pub enum $name {
            $( $(#[$vmeta])* $variant, )+
            /// A value this version does not know; kept verbatim.
            Other(String),
        }

        impl $name {
            /// Every value this version knows, in declaration order.
            pub const KNOWN: &'static [&'static str] = &[$($wire),+];

            /// The wire string of this value.
            pub fn as_str(&self) -> &str {
                match self {
                    $( Self::$variant => $wire, )+
                    Self::Other(other) => other.as_str(),
                }
            }

            /// Reads a wire string; unknown values become `Other`.
            pub fn parse(value: &str) -> Self {
                match value {
                    $( $wire => Self::$variant, )+
                    other => Self::Other(other.to_owned()),
                }
            }

            /// False for `Other`: the value is not one this version knows.
            pub fn is_known(&self) -> bool {
                !matches!(self, Self::Other(_))
            }
        }

        impl std::fmt::Debug for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                match self {
                    Self::Other(other) => write!(f, "{}::Other({:?})", stringify!($name), other),
                    known => write!(f, "{}::{}", stringify!($name), known.as_str()),
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl std::str::FromStr for $name {
            type Err = std::convert::Infallible;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                Ok(Self::parse(s))
            }
        }

        impl From<&str> for $name {
            fn from(value: &str) -> Self {
                Self::parse(value)
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(self.as_str())
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let value = std::borrow::Cow::<'de, str>::deserialize(deserializer)?;
                Ok(Self::parse(&value))
            }
        }

    };
}

/// Declares a unit type that stands for one fixed string (a `schema` discriminator).
macro_rules! const_str {
    ($(#[$meta:meta])* $name:ident = $value:expr) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
        pub struct $name;

        impl $name {
            /// The only wire value this type accepts.
            pub const VALUE: &'static str = $value;
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(Self::VALUE)
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let value = std::borrow::Cow::<'de, str>::deserialize(deserializer)?;
                if value == Self::VALUE {
                    Ok(Self)
                } else {
                    Err(serde::de::Error::custom(format_args!(
                        "expected \"{}\", found {:?}",
                        Self::VALUE,
                        value
                    )))
                }
            }
        }

        fixed_schema!($name, inline = true, { "const": $value });
    };
}

/// Declares `#[must_use]` builder setters inside an `impl`, each storing `Some(value)` in an
/// optional field: `with_name(field: into String);` takes `impl Into<String>`,
/// `with_size(field: u64);` the type itself.
macro_rules! setters {
    () => {};
    ($(#[$doc:meta])* $name:ident($field:ident: into $ty:ty); $($rest:tt)*) => {
        $(#[$doc])*
        #[must_use]
        pub fn $name(mut self, value: impl Into<$ty>) -> Self {
            self.$field = Some(value.into());
            self
        }
        setters!($($rest)*);
    };
    ($(#[$doc:meta])* $name:ident($field:ident: $ty:ty); $($rest:tt)*) => {
        $(#[$doc])*
        #[must_use]
        pub fn $name(mut self, value: $ty) -> Self {
            self.$field = Some(value);
            self
        }
        setters!($($rest)*);
    };
}
