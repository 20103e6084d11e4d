//! The example type every sentence(-pair) classification reader produces:
//! GLUE's nine tasks and the stand-ins alike.

/// A gold label.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Label {
    /// A class index into the task's label names.
    Class(u32),
    /// A regression score (STS-B).
    Score(f32),
}

/// One example.
#[derive(Debug, Clone, PartialEq)]
pub struct SentenceExample {
    /// Its id: the file's id column, else `<split>-<line>`.
    pub guid: String,
    /// The (first) sentence.
    pub text_a: String,
    /// The second sentence of a pair task.
    pub text_b: Option<String>,
    /// The gold label (`None` in test files).
    pub label: Option<Label>,
}
