//! Workspace-level tests live in this package's test targets (`tidy.rs`, and
//! the end-to-end runs of the real binaries that later issues add); the
//! library itself is empty.
