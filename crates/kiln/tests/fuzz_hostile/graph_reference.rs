//! A reference of PyTorch 2.15's autograd bookkeeping for the graph programs of
//! `graph_programs`: buffers with version counters, tensors that view them, recorded ops with
//! the tensors PyTorch saves for each, and a backward that refuses what PyTorch refuses and
//! otherwise returns each leaf's gradient from the values the ops saw when they ran.
//!
//! The rules, each checked in PyTorch 2.15:
//! - an op's output requires grad when grad mode is on and an input does; a view (`narrow`,
//!   `detach`) shares its input's buffer, and so its version counter;
//! - what each op saves: `exp`, `tanh` and `relu` their output; `square` its input; `a * b`
//!   `b` when `a` needs a gradient and `a` when `b` does; `a / b` `b` always and `a` when `b`
//!   needs a gradient; sums, differences, `neg`, scalar products and quotients, `narrow` and
//!   `clone` nothing;
//! - backward is refused when the root needs no gradient, when an op it reaches saved a buffer
//!   that was written since, or (kiln's rule, stricter than PyTorch's) when an op it reaches
//!   was already run by a backward without `retain_graph`: PyTorch runs again an op that saved
//!   nothing, kiln refuses every freed op the same way;
//! - an in-place update is refused (kiln's rule: it records no gradient) while grad mode is on
//!   and the destination or the source requires grad. PyTorch records one on a non-leaf; kiln
//!   asks for `no_grad` or the out-of-place op.

/// One buffer: its elements and its version counter.
#[derive(Debug, Clone)]
pub struct Buffer {
    pub data: Vec<f64>,
    pub version: u64,
}

/// A tensor: a 1-D window of a buffer, and its autograd state.
#[derive(Debug, Clone)]
pub struct RTensor {
    pub buffer: usize,
    pub offset: usize,
    pub len: usize,
    pub requires_grad: bool,
    /// The op that made it (a non-leaf).
    pub node: Option<usize>,
    /// Its index in [`Graph::grads`] (a leaf that requires grad).
    pub leaf: Option<usize>,
}

/// Where a recorded op's input gradient goes.
#[derive(Debug, Clone, Copy)]
pub enum Src {
    Node(usize),
    Leaf(usize),
}

/// The recorded ops, each with the input values its gradient reads.
#[derive(Debug, Clone)]
pub enum Rule {
    Neg,
    Exp {
        out: Vec<f64>,
    },
    Tanh {
        out: Vec<f64>,
    },
    Relu {
        out: Vec<f64>,
    },
    Square {
        x: Vec<f64>,
    },
    /// `x * c`.
    Scale(f64),
    /// `x / c`.
    Shrink(f64),
    Add,
    Sub,
    Mul {
        a: Vec<f64>,
        b: Vec<f64>,
    },
    Div {
        a: Vec<f64>,
        b: Vec<f64>,
    },
    /// `narrow(start, ..)` of an input of `base` elements.
    Narrow {
        start: usize,
        base: usize,
    },
    Clone,
}

#[derive(Debug, Clone)]
pub struct Node {
    pub rule: Rule,
    /// Per input: where its gradient goes (`None`: it needs none).
    pub inputs: Vec<Option<Src>>,
    /// The buffers PyTorch saves, with their versions then.
    pub saved: Vec<(usize, u64)>,
    pub freed: bool,
}

/// Every buffer, op and leaf gradient of one program.
#[derive(Debug, Default)]
pub struct Graph {
    pub buffers: Vec<Buffer>,
    pub nodes: Vec<Node>,
    pub grads: Vec<Option<Vec<f64>>>,
}

/// What an op returns.
pub enum Made<'a> {
    /// A new buffer holding `values`; `saved`: the op saves it for backward.
    Buffer { values: Vec<f64>, saved: bool },
    /// Elements `start..start + len` of `base`'s window, in its buffer.
    View {
        base: &'a RTensor,
        start: usize,
        len: usize,
    },
}

/// Why a backward is refused.
#[derive(Debug, PartialEq)]
pub enum Refusal {
    NoGrad,
    Modified,
    Freed,
}

impl Graph {
    /// The elements `t` sees.
    pub fn values(&self, t: &RTensor) -> Vec<f64> {
        self.buffers[t.buffer].data[t.offset..t.offset + t.len].to_vec()
    }

    /// A tensor over a new buffer holding `data`.
    pub fn fresh(&mut self, data: Vec<f64>, requires_grad: bool, node: Option<usize>) -> RTensor {
        self.buffers.push(Buffer { data, version: 0 });
        let leaf = (requires_grad && node.is_none()).then(|| self.new_leaf());
        RTensor {
            buffer: self.buffers.len() - 1,
            offset: 0,
            len: self.buffers.last().unwrap().data.len(),
            requires_grad,
            node,
            leaf,
        }
    }

    /// A new leaf that requires grad, with no gradient yet: its index in [`Graph::grads`].
    pub fn new_leaf(&mut self) -> usize {
        self.grads.push(None);
        self.grads.len() - 1
    }

    /// Where `t`'s gradient goes when an op reads it.
    fn src(t: &RTensor) -> Option<Src> {
        match (t.requires_grad, t.node, t.leaf) {
            (false, ..) => None,
            (true, Some(n), _) => Some(Src::Node(n)),
            (true, None, Some(l)) => Some(Src::Leaf(l)),
            (true, None, None) => unreachable!("a tensor that requires grad is a node or a leaf"),
        }
    }

    /// Records `rule` over `inputs` when grad mode is on and an input requires grad (`saves`:
    /// the inputs PyTorch saves), and returns its output, `out`.
    pub fn record(
        &mut self,
        grad_mode: bool,
        rule: Rule,
        inputs: &[&RTensor],
        saves: &[&RTensor],
        out: Made,
    ) -> RTensor {
        let requires_grad = grad_mode && inputs.iter().any(|t| t.requires_grad);
        let node = requires_grad.then(|| {
            let mut saved: Vec<(usize, u64)> = saves
                .iter()
                .map(|t| (t.buffer, self.buffers[t.buffer].version))
                .collect();
            if let Made::Buffer { saved: true, .. } = out {
                // the output's buffer is made next, at version 0
                saved.push((self.buffers.len(), 0));
            }
            self.nodes.push(Node {
                rule,
                inputs: inputs.iter().map(|t| Self::src(t)).collect(),
                saved,
                freed: false,
            });
            self.nodes.len() - 1
        });
        match out {
            Made::View { base, start, len } => RTensor {
                buffer: base.buffer,
                offset: base.offset + start,
                len,
                requires_grad,
                node,
                leaf: None,
            },
            Made::Buffer { values, .. } => self.fresh(values, requires_grad, node),
        }
    }

    /// Writes `values` into `t`'s window and bumps the buffer's version.
    pub fn write(&mut self, t: &RTensor, values: &[f64]) {
        let b = &mut self.buffers[t.buffer];
        b.data[t.offset..t.offset + t.len].copy_from_slice(values);
        b.version += 1;
    }

    /// The ops reachable from `root`, in the order a backward runs them (latest first).
    fn reachable(&self, root: usize) -> Vec<usize> {
        let mut seen = vec![false; self.nodes.len()];
        let mut stack = vec![root];
        seen[root] = true;
        while let Some(n) = stack.pop() {
            for src in self.nodes[n].inputs.iter().flatten() {
                if let Src::Node(m) = *src {
                    if !seen[m] {
                        seen[m] = true;
                        stack.push(m);
                    }
                }
            }
        }
        (0..self.nodes.len()).rev().filter(|&n| seen[n]).collect()
    }

    /// Backward from `root` with output gradient `g`: refused as PyTorch (and kiln's freed-op
    /// rule) refuse it, with every reason that holds (kiln names the first node it finds),
    /// and then no gradient changes (kiln's rule: PyTorch accumulates what ran before the op
    /// it refuses); else each reached leaf's gradient accumulated into [`Graph::grads`].
    pub fn backward(
        &mut self,
        root: &RTensor,
        g: &[f64],
        retain: bool,
    ) -> Result<(), Vec<Refusal>> {
        if !root.requires_grad {
            return Err(vec![Refusal::NoGrad]);
        }
        let Some(top) = root.node else {
            let leaf = root.leaf.expect("a leaf that requires grad");
            self.accumulate(&[(leaf, g.to_vec())]);
            return Ok(());
        };
        let order = self.reachable(top);
        let stale = |&(b, v): &(usize, u64)| self.buffers[b].version != v;
        let mut why = Vec::new();
        if order.iter().any(|&n| self.nodes[n].freed) {
            why.push(Refusal::Freed);
        }
        if order.iter().any(|&n| self.nodes[n].saved.iter().any(stale)) {
            why.push(Refusal::Modified);
        }
        if !why.is_empty() {
            return Err(why);
        }
        let mut pending: Vec<Option<Vec<f64>>> = vec![None; self.nodes.len()];
        pending[top] = Some(g.to_vec());
        let mut to_leaves: Vec<(usize, Vec<f64>)> = Vec::new();
        for &n in &order {
            let Some(gn) = pending[n].take() else {
                continue;
            };
            let node = &self.nodes[n];
            for (src, gi) in node.inputs.iter().zip(input_grads(&node.rule, &gn)) {
                match src {
                    Some(Src::Node(m)) => add_into(&mut pending[*m], &gi),
                    Some(Src::Leaf(l)) => to_leaves.push((*l, gi)),
                    None => {}
                }
            }
            if !retain {
                self.nodes[n].freed = true;
            }
        }
        self.accumulate(&to_leaves);
        Ok(())
    }

    fn accumulate(&mut self, parts: &[(usize, Vec<f64>)]) {
        for (leaf, g) in parts {
            add_into(&mut self.grads[*leaf], g);
        }
    }
}

fn add_into(slot: &mut Option<Vec<f64>>, g: &[f64]) {
    match slot {
        Some(s) => s.iter_mut().zip(g).for_each(|(s, g)| *s += g),
        None => *slot = Some(g.to_vec()),
    }
}

/// The gradient of each input of `rule`, given the output's gradient `g`.
fn input_grads(rule: &Rule, g: &[f64]) -> Vec<Vec<f64>> {
    let map = |f: &dyn Fn(usize) -> f64| (0..g.len()).map(f).collect::<Vec<f64>>();
    match rule {
        Rule::Neg => vec![map(&|i| -g[i])],
        Rule::Exp { out } => vec![map(&|i| g[i] * out[i])],
        Rule::Tanh { out } => vec![map(&|i| g[i] * (1.0 - out[i] * out[i]))],
        // PyTorch's `threshold_backward`: 0 where the output is at most 0, so a NaN passes
        Rule::Relu { out } => vec![map(&|i| if out[i] <= 0.0 { 0.0 } else { g[i] })],
        Rule::Square { x } => vec![map(&|i| 2.0 * x[i] * g[i])],
        Rule::Scale(c) => vec![map(&|i| g[i] * c)],
        Rule::Shrink(c) => vec![map(&|i| g[i] / c)],
        Rule::Add => vec![g.to_vec(), g.to_vec()],
        Rule::Sub => vec![g.to_vec(), map(&|i| -g[i])],
        Rule::Mul { a, b } => vec![map(&|i| g[i] * b[i]), map(&|i| g[i] * a[i])],
        Rule::Div { a, b } => vec![
            map(&|i| g[i] / b[i]),
            map(&|i| -g[i] * ((a[i] / b[i]) / b[i])),
        ],
        Rule::Narrow { start, base } => {
            let mut full = vec![0.0; *base];
            full[*start..*start + g.len()].copy_from_slice(g);
            vec![full]
        }
        Rule::Clone => vec![g.to_vec()],
    }
}
