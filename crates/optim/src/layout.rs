//! The flat layout of a module's trainable parameters.
//!
//! Segments follow the module's visit order, which burn's derive makes the
//! field-declaration order: deterministic, identical on every rank, unlike
//! `ParamId`s, which are random per process. Cross-rank data is therefore keyed
//! by path and offset, never by id.

use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::Tensor;
use serde::{Deserialize, Serialize};

/// One parameter tensor inside the flat vector.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Segment {
    /// Dotted module path, e.g. `encoder.layers.0.attention.query.weight`.
    pub path: String,
    /// The parameter's shape.
    pub shape: Vec<usize>,
    /// First element of the segment in the flat vector.
    pub offset: usize,
    /// Number of elements (product of `shape`).
    pub len: usize,
    /// Whether weight decay applies. 1-D parameters (biases, norm scales and
    /// shifts) get none, as in BERT's and both LAMB papers' recipes.
    pub decay: bool,
}

impl Segment {
    /// The element range of this segment in the flat vector.
    pub fn range(&self) -> std::ops::Range<usize> {
        self.offset..self.offset + self.len
    }
}

/// All trainable parameters of a module as consecutive segments of one vector.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ParamLayout {
    segments: Vec<Segment>,
    len: usize,
}

impl ParamLayout {
    /// The layout of `module`'s trainable float parameters, in visit order.
    ///
    /// A parameter is trainable unless it lives on an autodiff device and does
    /// not require gradients (frozen). On a device without autodiff every float
    /// parameter is included, so a layout can be built before training starts.
    pub fn from_module<M: Module>(module: &M) -> Self {
        let mut visitor = LayoutVisitor::default();
        module.visit(&mut visitor);
        Self::from_shapes(visitor.found)
    }

    /// A layout from `(path, shape)` pairs in order; decay follows the rank.
    pub fn from_shapes(params: impl IntoIterator<Item = (String, Vec<usize>)>) -> Self {
        let mut len = 0;
        let segments = params
            .into_iter()
            .map(|(path, shape)| {
                let n = shape.iter().product();
                let segment = Segment {
                    path,
                    decay: shape.len() > 1,
                    shape,
                    offset: len,
                    len: n,
                };
                len += n;
                segment
            })
            .collect();
        Self { segments, len }
    }

    /// The segments in flat order.
    pub fn segments(&self) -> &[Segment] {
        &self.segments
    }

    /// Total number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the layout has no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The segment with this path.
    pub fn segment(&self, path: &str) -> Option<&Segment> {
        self.segments.iter().find(|s| s.path == path)
    }

    /// Describes the first difference between `self` and `other`, if any.
    pub(crate) fn first_difference(&self, other: &ParamLayout) -> Option<(usize, String)> {
        let n = self.segments.len().max(other.segments.len());
        (0..n).find_map(|i| match (self.segments.get(i), other.segments.get(i)) {
            (Some(a), Some(b)) if a.path == b.path && a.shape == b.shape => None,
            (a, b) => Some((
                i,
                format!("expected {}, found {}", describe(a), describe(b)),
            )),
        })
    }
}

fn describe(segment: Option<&Segment>) -> String {
    match segment {
        Some(s) => format!("`{}` {:?}", s.path, s.shape),
        None => "no parameter".to_string(),
    }
}

/// Whether a parameter takes part in optimisation (see [`ParamLayout::from_module`]).
pub(crate) fn is_trainable<const D: usize>(tensor: &Tensor<D>) -> bool {
    !tensor.is_autodiff() || tensor.is_require_grad()
}

/// Tracks the module path through `enter_module`/`exit_module`.
#[derive(Default)]
struct PathStack(Vec<String>);

impl PathStack {
    fn enter(&mut self, name: &str) {
        self.0.push(name.to_string());
    }

    fn exit(&mut self) {
        self.0.pop();
    }

    fn current(&self) -> String {
        self.0.join(".")
    }
}

#[derive(Default)]
struct LayoutVisitor {
    path: PathStack,
    found: Vec<(String, Vec<usize>)>,
}

impl ModuleVisitor for LayoutVisitor {
    fn enter_module(&mut self, name: &str, _container_type: &str) {
        self.path.enter(name);
    }

    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.path.exit();
    }

    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let tensor = param.val();
        if is_trainable(&tensor) {
            self.found
                .push((self.path.current(), tensor.dims().to_vec()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_are_cumulative_and_decay_follows_rank() {
        let layout = ParamLayout::from_shapes([
            ("a.weight".to_string(), vec![3, 4]),
            ("a.bias".to_string(), vec![4]),
            ("b.weight".to_string(), vec![2, 2, 2]),
        ]);
        let s = layout.segments();
        assert_eq!((s[0].offset, s[0].len, s[0].decay), (0, 12, true));
        assert_eq!((s[1].offset, s[1].len, s[1].decay), (12, 4, false));
        assert_eq!((s[2].offset, s[2].len, s[2].decay), (16, 8, true));
        assert_eq!(layout.len(), 24);
        assert_eq!(layout.segment("a.bias").unwrap().range(), 12..16);
    }

    #[test]
    fn first_difference_names_both_sides() {
        let a = ParamLayout::from_shapes([("w".to_string(), vec![2, 2])]);
        let b = ParamLayout::from_shapes([("w".to_string(), vec![4])]);
        let (i, detail) = a.first_difference(&b).unwrap();
        assert_eq!(i, 0);
        assert!(
            detail.contains("[2, 2]") && detail.contains("[4]"),
            "{detail}"
        );
        assert!(a.first_difference(&a.clone()).is_none());
    }
}
