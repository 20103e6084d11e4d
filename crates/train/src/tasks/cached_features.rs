//! What a run says of its cached features (`terse_data`'s feature cache):
//! read from the cache, or made now and kept there, and how long it took.

use std::path::Path;
use std::time::Instant;

use terse_data::FeatureSource;

/// Logs where `name`'s features came from: `read` (e.g. "97077 windows")
/// from the cache file `path`, or `made` (e.g. "87599 questions") `verb`
/// (e.g. "featurized") now, since `started`.
pub(super) fn log_source(
    name: &str,
    source: FeatureSource,
    path: &Path,
    read: String,
    (made, verb): (String, &str),
    started: Instant,
) {
    let seconds = started.elapsed().as_secs_f64();
    match source {
        FeatureSource::Cache => tracing::info!(
            "{read} of {name} read from {} in {seconds:.1} s",
            path.display()
        ),
        FeatureSource::Featurized { kept } => tracing::info!(
            "{made} of {name} {verb} in {seconds:.1} s{}",
            if kept {
                format!(", kept in {}", path.display())
            } else {
                String::new()
            }
        ),
    }
}
