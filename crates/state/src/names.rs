//! Enums carried as strings in the local config YAML and the config dump.

/// Defines a fieldless enum whose serde form is a string: one canonical name per
/// variant (what we write), plus aliases we also accept when reading (ztunnel's YAML
/// names and the proto enum names). Names listed under `reject` are known but refused,
/// with the given reason.
macro_rules! string_enum {
    (
        $(#[$m:meta])*
        $vis:vis enum $name:ident {
            $( $(#[$vm:meta])* $variant:ident = $canon:literal $(| $alias:literal)* ),+ $(,)?
        }
        $( reject { $( $rname:literal => $reason:literal ),+ $(,)? } )?
    ) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        $vis enum $name {
            $( $(#[$vm])* $variant ),+
        }

        impl $name {
            /// The canonical names, in declaration order.
            pub const NAMES: &'static [&'static str] = &[$($canon),+];

            /// The canonical name (as written to YAML and the config dump).
            pub fn as_str(&self) -> &'static str {
                match self {
                    $( Self::$variant => $canon ),+
                }
            }

            /// Looks up a canonical name or an alias.
            pub fn from_name(s: &str) -> Option<Self> {
                match s {
                    $( $canon $(| $alias)* => Some(Self::$variant), )+
                    _ => None,
                }
            }
        }

        impl ::std::fmt::Display for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl ::serde::Serialize for $name {
            fn serialize<S: ::serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        impl<'de> ::serde::Deserialize<'de> for $name {
            fn deserialize<D: ::serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                $crate::names::from_str_with(d, "a string", |s| -> Result<Self, $crate::names::StrError<&'static str>> {
                    if let Some(v) = Self::from_name(s) {
                        return Ok(v);
                    }
                    $( $( if s == $rname {
                        return Err($crate::names::StrError::Custom($reason));
                    } )+ )?
                    Err($crate::names::StrError::UnknownVariant(Self::NAMES))
                })
            }
        }
    };
}

pub(crate) use string_enum;

/// Deserializes a string and converts it with `f` *inside* the deserializer's string
/// callback, so that a conversion error carries the value's line and column (an error
/// raised after `String::deserialize` returns would be reported at the enclosing map).
pub(crate) fn from_str_with<'de, D, T, E, F>(
    d: D,
    expecting: &'static str,
    f: F,
) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    E: std::fmt::Display,
    F: FnOnce(&str) -> Result<T, StrError<E>>,
{
    struct V<F>(F, &'static str);
    impl<'de, T, E, F> serde::de::Visitor<'de> for V<F>
    where
        E: std::fmt::Display,
        F: FnOnce(&str) -> Result<T, StrError<E>>,
    {
        type Value = T;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.1)
        }
        fn visit_str<Er: serde::de::Error>(self, v: &str) -> Result<T, Er> {
            (self.0)(v).map_err(|e| match e {
                StrError::Custom(m) => Er::custom(m),
                StrError::UnknownVariant(names) => Er::unknown_variant(v, names),
            })
        }
    }
    d.deserialize_str(V(f, expecting))
}

/// The errors [`from_str_with`] conversions may raise.
pub(crate) enum StrError<E> {
    Custom(E),
    UnknownVariant(&'static [&'static str]),
}
