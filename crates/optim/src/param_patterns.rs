//! Parameters named by path patterns in an optimizer's config (each a
//! parameter path, or a prefix followed by `*`): the parameters kept out of
//! compression, DeepSpeed's `non_freeze` groups and the momentum mask all
//! name theirs this way.

use std::ops::Range;

use crate::{OptimError, ParamLayout, Segment};

/// The segments of `layout` that `patterns` name (each a parameter path,
/// or a prefix followed by `*`), in layout order; `field` names the config
/// field in errors.
///
/// # Errors
/// A pattern that names no parameter (a typo would otherwise silently
/// leave out nothing), with the model's parameter paths.
pub(crate) fn matching_segments<'a>(
    patterns: &[&str],
    field: &str,
    layout: &'a ParamLayout,
) -> Result<Vec<&'a Segment>, OptimError> {
    for pattern in patterns {
        if !layout.segments().iter().any(|s| matches(pattern, &s.path)) {
            let paths: Vec<&str> = layout.segments().iter().map(|s| s.path.as_str()).collect();
            let shown = paths.iter().take(8).copied().collect::<Vec<_>>().join(", ");
            return Err(OptimError::InvalidConfig {
                field: field.to_string(),
                value: format!(
                    "\"{pattern}\" (the model's parameters: {shown}{})",
                    if paths.len() > 8 {
                        format!(", … {} in all", paths.len())
                    } else {
                        String::new()
                    }
                ),
                reason: "names no parameter of the model; end a prefix with `*`",
            });
        }
    }
    Ok(layout
        .segments()
        .iter()
        .filter(|s| patterns.iter().any(|p| matches(p, &s.path)))
        .collect())
}

/// The non-empty ranges of [`matching_segments`].
pub(crate) fn segment_ranges(
    patterns: &[String],
    field: &str,
    layout: &ParamLayout,
) -> Result<Vec<Range<usize>>, OptimError> {
    let patterns: Vec<&str> = patterns.iter().map(String::as_str).collect();
    Ok(matching_segments(&patterns, field, layout)?
        .into_iter()
        .map(|s| s.range())
        .filter(|r| !r.is_empty())
        .collect())
}

/// Whether `pattern` names the parameter at `path`: equal, or a prefix
/// ending in `*`.
fn matches(pattern: &str, path: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => path.starts_with(prefix),
        None => pattern == path,
    }
}

#[cfg(test)]
mod tests {
    use super::matches;

    #[test]
    fn a_pattern_is_a_path_or_a_prefix_with_a_star() {
        assert!(matches(
            "embeddings.position.weight",
            "embeddings.position.weight"
        ));
        assert!(!matches(
            "embeddings.position",
            "embeddings.position.weight"
        ));
        assert!(matches("embeddings.*", "embeddings.position.weight"));
        assert!(matches("*", "anything"));
        assert!(!matches("encoder.*", "embeddings.position.weight"));
    }
}
