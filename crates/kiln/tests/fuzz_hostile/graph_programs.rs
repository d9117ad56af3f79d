//! Random autograd programs against `graph_reference`: leaves with and without `requires_grad`,
//! elementwise ops in and out of `no_grad`, views (`narrow`, hostile bounds included, and
//! `detach`) that share a buffer, `copy_data`, `set_requires_grad`, in-place updates
//! (`add_`, `copy_`, `fill_`, `mul_scalar_`, `relu_`) through any of the handles that share a
//! buffer, the owned ops (`into_relu`, `into_add`) that may write over their operand, and
//! backwards with and without `retain_graph`, repeated, with `zero_grad` between some.
//!
//! After every step: refused exactly where the reference refuses, every tensor's values and
//! `requires_grad` the reference's, and after a backward every leaf's gradient the reference's
//! (from the values the ops saw when they ran). So an in-place write that a saved tensor does
//! not notice, a write an owned op makes over a buffer someone else sees, a gradient sent to
//! the wrong leaf and a refusal PyTorch does not make all fail. A refused backward must leave
//! every gradient as it was; a program stops there.

use crate::graph_reference::{Graph, Made, RTensor, Refusal, Rule};
use crate::graph_steps::{generate, BinaryKind, Program, Step, UnaryKind, Write};
use crate::harness::{run, Outcome};
use crate::numeric::{assert_close, float_tensor, upstream};
use kiln::autograd::{no_grad, DType, Device, Tensor};

/// kiln's tensors, the reference's, and every leaf that requires grad (kiln's handle, its
/// index in the reference's gradients).
struct State {
    kiln: Vec<Tensor>,
    model: Vec<RTensor>,
    graph: Graph,
    leaves: Vec<(Tensor, usize)>,
}

impl State {
    /// The index of a tensor of `of`'s length, picked by `pick`.
    fn partner(&self, of: usize, pick: usize) -> usize {
        let len = self.model[of].len;
        let same: Vec<usize> = (0..self.model.len())
            .filter(|&i| self.model[i].len == len)
            .collect();
        same[pick % same.len()]
    }

    /// kiln's tensor `x`, its slot left holding a placeholder, so the caller holds the only
    /// handle the program had (what an owned op such as `into_relu` is given).
    fn give_up(&mut self, x: usize) -> Tensor {
        let placeholder = Tensor::scalar(0.0, DType::F64, Device::Cpu).unwrap();
        std::mem::replace(&mut self.kiln[x], placeholder)
    }

    fn push(&mut self, t: Tensor, r: RTensor) {
        self.kiln.push(t);
        self.model.push(r);
    }

    /// Every tensor's values and `requires_grad`, and every leaf's gradient, are the
    /// reference's.
    fn check(&self, at: usize) {
        for (i, (t, r)) in self.kiln.iter().zip(&self.model).enumerate() {
            let what = format!("step {at}: tensor {i}");
            assert_eq!(t.requires_grad(), r.requires_grad, "{what}: requires_grad");
            assert_close(
                &what,
                &t.to_vec_f64().unwrap(),
                &self.graph.values(r),
                1e-12,
            );
        }
        for (t, id) in &self.leaves {
            let what = format!("step {at}: the gradient of leaf {id}");
            match (t.grad(), &self.graph.grads[*id]) {
                (None, None) => {}
                (Some(g), Some(w)) => assert_close(&what, &g.to_vec_f64().unwrap(), w, 1e-12),
                (g, w) => panic!("{what}: kiln {g:?}, reference {w:?}"),
            }
        }
    }
}

/// PyTorch's `relu`: NaN stays NaN, `-0.0` and negatives become `0.0`.
fn relu(a: f64) -> f64 {
    if a > 0.0 || a.is_nan() {
        a
    } else {
        0.0
    }
}

fn under(no_grad_on: bool, f: impl FnOnce() -> kiln::autograd::Result<Tensor>) -> Tensor {
    let out = if no_grad_on { no_grad(f) } else { f() };
    out.expect("a valid op on valid operands")
}

fn unary(s: &mut State, x: usize, kind: UnaryKind, ng: bool) {
    let (t, r) = (s.kiln[x].clone(), s.model[x].clone());
    let v = s.graph.values(&r);
    let map = |f: fn(f64) -> f64| v.iter().map(|&a| f(a)).collect::<Vec<f64>>();
    let scaled = |c: f64, div: bool| {
        v.iter()
            .map(|&a| if div { a / c } else { a * c })
            .collect::<Vec<f64>>()
    };
    let (out, rule, saves_input, saves_output) = match kind {
        UnaryKind::Neg => (map(|a| -a), Rule::Neg, false, false),
        UnaryKind::Exp => {
            let out = map(f64::exp);
            (out.clone(), Rule::Exp { out }, false, true)
        }
        UnaryKind::Tanh => {
            let out = map(f64::tanh);
            (out.clone(), Rule::Tanh { out }, false, true)
        }
        UnaryKind::Relu => {
            let out = map(relu);
            (out.clone(), Rule::Relu { out }, false, true)
        }
        UnaryKind::Square => (map(|a| a * a), Rule::Square { x: v.clone() }, true, false),
        UnaryKind::MulScalar(c) => (scaled(c, false), Rule::Scale(c), false, false),
        UnaryKind::DivScalar(c) => (scaled(c, true), Rule::Shrink(c), false, false),
    };
    let kt = under(ng, || match kind {
        UnaryKind::Neg => t.neg(),
        UnaryKind::Exp => t.exp(),
        UnaryKind::Tanh => t.tanh(),
        UnaryKind::Relu => t.relu(),
        UnaryKind::Square => t.square(),
        UnaryKind::MulScalar(c) => t.mul_scalar(c),
        UnaryKind::DivScalar(c) => t.div_scalar(c),
    });
    let saves: Vec<&RTensor> = if saves_input { vec![&r] } else { vec![] };
    let rt = s.graph.record(
        !ng,
        rule,
        &[&r],
        &saves,
        Made::Buffer {
            values: out,
            saved: saves_output,
        },
    );
    s.push(kt, rt);
}

/// The reference's `x kind y` (recorded unless `ng`), with what PyTorch saves for it.
fn binary_model(s: &mut State, x: usize, y: usize, kind: BinaryKind, ng: bool) -> RTensor {
    let (ra, rb) = (s.model[x].clone(), s.model[y].clone());
    let (a, b) = (s.graph.values(&ra), s.graph.values(&rb));
    let zip = |f: fn(f64, f64) -> f64| a.iter().zip(&b).map(|(&p, &q)| f(p, q)).collect();
    let (out, rule, saves): (Vec<f64>, Rule, Vec<&RTensor>) = match kind {
        BinaryKind::Add => (zip(|p, q| p + q), Rule::Add, vec![]),
        BinaryKind::Sub => (zip(|p, q| p - q), Rule::Sub, vec![]),
        BinaryKind::Mul => {
            let mut saves = vec![];
            if rb.requires_grad {
                saves.push(&ra);
            }
            if ra.requires_grad {
                saves.push(&rb);
            }
            let rule = Rule::Mul {
                a: a.clone(),
                b: b.clone(),
            };
            (zip(|p, q| p * q), rule, saves)
        }
        BinaryKind::Div => {
            let mut saves = vec![&rb];
            if rb.requires_grad {
                saves.push(&ra);
            }
            let rule = Rule::Div {
                a: a.clone(),
                b: b.clone(),
            };
            (zip(|p, q| p / q), rule, saves)
        }
    };
    s.graph.record(
        !ng,
        rule,
        &[&ra, &rb],
        &saves,
        Made::Buffer {
            values: out,
            saved: false,
        },
    )
}

/// Runs one in-place update in both; `false` when it was (rightly) refused.
fn in_place(s: &mut State, x: usize, write: Write, ng: bool) -> bool {
    let (t, r) = (s.kiln[x].clone(), s.model[x].clone());
    let v = s.graph.values(&r);
    let source = match write {
        Write::AddFrom(y) | Write::CopyFrom(y) => Some(s.partner(x, y)),
        _ => None,
    };
    let src_grad = source.is_some_and(|j| s.model[j].requires_grad);
    let refused = !ng && (r.requires_grad || src_grad);
    let result = {
        let src = source.map(|j| s.kiln[j].clone());
        let apply = || match write {
            Write::AddFrom(_) => t.add_(src.as_ref().unwrap()),
            Write::CopyFrom(_) => t.copy_(src.as_ref().unwrap()),
            Write::MulScalar(c) => t.mul_scalar_(c),
            Write::Fill(c) => t.fill_(c),
            Write::Relu => t.relu_(),
        };
        if ng {
            no_grad(apply)
        } else {
            apply()
        }
    };
    assert_eq!(result.is_err(), refused, "{write:?}: kiln {result:?}");
    if refused {
        return false;
    }
    let new: Vec<f64> = match write {
        Write::AddFrom(_) | Write::CopyFrom(_) => {
            let w = s.graph.values(&s.model[source.unwrap()]);
            match write {
                Write::AddFrom(_) => v.iter().zip(&w).map(|(a, b)| a + b).collect(),
                _ => w,
            }
        }
        Write::MulScalar(c) => v.iter().map(|a| a * c).collect(),
        Write::Fill(c) => vec![c; v.len()],
        Write::Relu => v.iter().map(|&a| relu(a)).collect(),
    };
    s.graph.write(&r, &new);
    true
}

fn narrow(s: &mut State, x: usize, start: usize, len: usize, hostile: bool, ng: bool) -> bool {
    let n = s.model[x].len;
    let (start, len) = match hostile {
        true => (start, len),
        false => (start % (n + 1), len % (n - start % (n + 1) + 1)),
    };
    let t = s.kiln[x].clone();
    let kiln = if ng {
        no_grad(|| t.narrow(0, start, len))
    } else {
        t.narrow(0, start, len)
    };
    let fits = start.checked_add(len).is_some_and(|end| end <= n);
    assert_eq!(
        kiln.is_ok(),
        fits,
        "narrow({start}, {len}) of {n}: kiln {kiln:?}"
    );
    let Ok(kt) = kiln else {
        return false;
    };
    let r = s.model[x].clone();
    let rule = Rule::Narrow { start, base: n };
    let rt = s.graph.record(
        !ng,
        rule,
        &[&r],
        &[],
        Made::View {
            base: &r,
            start,
            len,
        },
    );
    s.push(kt, rt);
    true
}

/// Runs one step in both; `false` when it was (rightly) refused.
fn execute(s: &mut State, step: &Step) -> bool {
    let count = s.kiln.len();
    match *step {
        Step::Leaf { ref values, grad } => {
            let t = float_tensor(values, &[values.len()], false, grad);
            let r = s.graph.fresh(values.clone(), grad, None);
            if let Some(id) = r.leaf {
                s.leaves.push((t.clone(), id));
            }
            s.push(t, r);
        }
        Step::Unary { x, kind, no_grad } => unary(s, x % count, kind, no_grad),
        Step::Binary {
            x,
            y,
            kind,
            no_grad,
        } => {
            let x = x % count;
            let y = s.partner(x, y);
            let (ta, tb) = (&s.kiln[x], &s.kiln[y]);
            let kt = under(no_grad, || match kind {
                BinaryKind::Add => ta.add(tb),
                BinaryKind::Sub => ta.sub(tb),
                BinaryKind::Mul => ta.mul(tb),
                BinaryKind::Div => ta.div(tb),
            });
            let rt = binary_model(s, x, y, kind, no_grad);
            s.push(kt, rt);
        }
        Step::Narrow {
            x,
            start,
            len,
            hostile,
            no_grad,
        } => return narrow(s, x % count, start, len, hostile, no_grad),
        Step::Detach(x) => {
            let (t, mut r) = (s.kiln[x % count].detach(), s.model[x % count].clone());
            (r.requires_grad, r.node, r.leaf) = (false, None, None);
            s.push(t, r);
        }
        Step::CopyData(x) => {
            let r = s.model[x % count].clone();
            let out = s.graph.values(&r);
            let rt = s.graph.record(
                true,
                Rule::Clone,
                &[&r],
                &[],
                Made::Buffer {
                    values: out,
                    saved: false,
                },
            );
            s.push(s.kiln[x % count].copy_data().unwrap(), rt);
        }
        Step::RequireGrad(x) => {
            let x = x % count;
            let kiln = s.kiln[x].set_requires_grad(true);
            let leaf = s.model[x].node.is_none();
            assert_eq!(kiln.is_ok(), leaf, "set_requires_grad: kiln {kiln:?}");
            if !leaf {
                return false;
            }
            if !s.model[x].requires_grad {
                let id = s.graph.new_leaf();
                (s.model[x].requires_grad, s.model[x].leaf) = (true, Some(id));
                s.leaves.push((s.kiln[x].clone(), id));
            }
        }
        Step::InPlace { x, write, no_grad } => return in_place(s, x % count, write, no_grad),
        Step::IntoRelu(x) => {
            let x = x % count;
            let (r, v) = (s.model[x].clone(), s.graph.values(&s.model[x]));
            let out: Vec<f64> = v.iter().map(|&a| relu(a)).collect();
            let rule = Rule::Relu { out: out.clone() };
            let owned = s.give_up(x);
            s.kiln[x] = owned.into_relu().expect("relu of a float tensor");
            s.model[x] = s.graph.record(
                true,
                rule,
                &[&r],
                &[],
                Made::Buffer {
                    values: out,
                    saved: true,
                },
            );
        }
        Step::IntoAdd { x, y } => {
            let x = x % count;
            let y = s.partner(x, y);
            let rt = binary_model(s, x, y, BinaryKind::Add, false);
            let rhs = s.kiln[y].clone();
            let owned = s.give_up(x);
            s.kiln[x] = owned
                .into_add(&rhs)
                .expect("a sum of two tensors of one shape");
            s.model[x] = rt;
        }
        Step::Backward { x, retain } => {
            let x = x % count;
            let len = s.model[x].len;
            let g: Vec<f64> = (0..len).map(upstream).collect();
            let gt = float_tensor(&g, &[len], false, false);
            let kiln = s.kiln[x].backward_with(Some(&gt), retain);
            let root = s.model[x].clone();
            let want = s.graph.backward(&root, &g, retain);
            match (&kiln, &want) {
                (Ok(()), Ok(())) => {}
                (Err(e), Err(why)) => {
                    let text = e.to_string();
                    let said = why.iter().any(|why| match why {
                        Refusal::NoGrad => text.contains("require"),
                        Refusal::Modified => text.contains("modified in place"),
                        Refusal::Freed => text.contains("second time"),
                    });
                    assert!(said, "backward refused for {why:?}, but kiln said: {text}");
                    return false;
                }
                _ => panic!("backward: kiln {kiln:?}, reference {want:?}"),
            }
        }
        Step::ZeroGrad => {
            for (t, id) in &s.leaves {
                t.set_grad(None).unwrap();
                s.graph.grads[*id] = None;
            }
        }
    }
    true
}

fn check(program: &Program) -> Outcome {
    let mut s = State {
        kiln: Vec::new(),
        model: Vec::new(),
        graph: Graph::default(),
        leaves: Vec::new(),
    };
    let mut refused = false;
    for (at, step) in program.steps.iter().enumerate() {
        let done = execute(&mut s, step);
        s.check(at);
        if !done {
            refused = true;
            if matches!(step, Step::Backward { .. }) {
                break;
            }
        }
    }
    if refused {
        Outcome::Refused
    } else {
        Outcome::Accepted
    }
}

pub fn graph_programs(seed: u64, cases: usize) {
    run(
        "autograd programs with views and in-place updates vs a reference",
        seed,
        cases,
        generate,
        check,
    );
}
