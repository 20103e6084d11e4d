//! What every optimizer config shares in validation: the error value that
//! names the field, the range checks used by more than one optimizer, and
//! the rejection of keys no field claims.

use serde::de::{Deserialize, Deserializer, IgnoredAny, MapAccess, Visitor};

use crate::OptimError;

/// The error for `field` (dotted, `adam.beta_2`) holding `value`.
pub(crate) fn invalid(field: impl Into<String>, value: String, reason: &'static str) -> OptimError {
    OptimError::InvalidConfig {
        field: field.into(),
        value,
        reason,
    }
}

/// Decoupled or L2 weight decay: finite and not negative.
pub(crate) fn check_decay(field: String, weight_decay: f64) -> Result<(), OptimError> {
    if weight_decay >= 0.0 && weight_decay.is_finite() {
        Ok(())
    } else {
        Err(invalid(
            field,
            weight_decay.to_string(),
            "needs 0 <= weight_decay < inf",
        ))
    }
}

/// A decay rate in `[0, 1)`.
pub(crate) fn check_unit(field: String, value: f64) -> Result<(), OptimError> {
    if (0.0..1.0).contains(&value) {
        Ok(())
    } else {
        Err(invalid(field, value.to_string(), "needs 0 <= value < 1"))
    }
}

/// A `[lower, upper]` clip range, `0 < lower <= upper < inf`, reported on
/// the lower field (`reason` states the rule with the fields' names).
pub(crate) fn check_clip(
    field: String,
    upper_name: &str,
    (lower, upper): (f64, f64),
    reason: &'static str,
) -> Result<(), OptimError> {
    if lower > 0.0 && lower <= upper && upper.is_finite() {
        Ok(())
    } else {
        Err(invalid(
            field,
            format!("{lower} ({upper_name} = {upper})"),
            reason,
        ))
    }
}

/// The last field of a config whose shared settings are `#[serde(flatten)]`ed:
/// serde's `deny_unknown_fields` does not work together with `flatten`, so
/// this field receives every key no other field claimed and refuses the
/// first one. A typo (`beta1`) stays an error at parse time, as it was
/// before the shared settings moved into their own structs.
///
/// It must be declared after the flattened structs: serde hands a flattened
/// map the keys the earlier fields left.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NoOtherFields;

impl<'de> Deserialize<'de> for NoOtherFields {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Refuse;
        impl<'de> Visitor<'de> for Refuse {
            type Value = NoOtherFields;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("no fields besides the optimizer's own")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                match map.next_key::<String>()? {
                    None => Ok(NoOtherFields),
                    Some(key) => {
                        let _: IgnoredAny = map.next_value()?;
                        Err(serde::de::Error::custom(format!(
                            "unknown field `{key}` for this optimizer"
                        )))
                    }
                }
            }
        }
        deserializer.deserialize_map(Refuse)
    }
}

/// The `with_*` methods of a builder trait: each sets one field of the
/// struct its accessor (`moments_mut`, `compression_mut`) returns.
macro_rules! with_setters {
    ($access:ident; $($(#[$doc:meta])* $name:ident($field:ident: $ty:ty)),* $(,)?) => {
        $(
            $(#[$doc])*
            fn $name(mut self, $field: $ty) -> Self {
                self.$access().$field = $field;
                self
            }
        )*
    };
}
pub(crate) use with_setters;

/// The accessors the builder traits ([`crate::WithMoments`] and the
/// compression stage's) take a config's settings through, each to the
/// field that flattens them: `field: Settings => Trait, accessor;` a line.
macro_rules! flattens {
    ($config:ty { $($field:ident: $settings:ty => $trait:path, $access:ident;)* }) => {
        $(
            impl $trait for $config {
                fn $access(&mut self) -> &mut $settings {
                    &mut self.$field
                }
            }
        )*
    };
}
pub(crate) use flattens;
