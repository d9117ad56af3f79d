//! The programs of `graph_programs`: their steps, and the generator of random ones (two leaves
//! that require grad, then 4 to 23 random steps, then a backward).

use crate::harness::Rng;

#[derive(Debug, Clone, Copy)]
pub enum UnaryKind {
    Neg,
    Exp,
    Tanh,
    Relu,
    Square,
    MulScalar(f64),
    DivScalar(f64),
}

#[derive(Debug, Clone, Copy)]
pub enum BinaryKind {
    Add,
    Sub,
    Mul,
    Div,
}

/// An in-place update; a source is picked among the tensors of the destination's length.
#[derive(Debug, Clone, Copy)]
pub enum Write {
    AddFrom(usize),
    CopyFrom(usize),
    MulScalar(f64),
    Fill(f64),
    Relu,
}

/// One step. Tensor operands are picked modulo the tensors present; a second operand among
/// those of the first one's length.
#[derive(Debug, Clone)]
pub enum Step {
    Leaf {
        values: Vec<f64>,
        grad: bool,
    },
    Unary {
        x: usize,
        kind: UnaryKind,
        no_grad: bool,
    },
    Binary {
        x: usize,
        y: usize,
        kind: BinaryKind,
        no_grad: bool,
    },
    /// `narrow(0, start, len)`: within bounds unless `hostile`, then as given.
    Narrow {
        x: usize,
        start: usize,
        len: usize,
        hostile: bool,
        no_grad: bool,
    },
    Detach(usize),
    CopyData(usize),
    RequireGrad(usize),
    InPlace {
        x: usize,
        write: Write,
        no_grad: bool,
    },
    IntoRelu(usize),
    IntoAdd {
        x: usize,
        y: usize,
    },
    Backward {
        x: usize,
        retain: bool,
    },
    ZeroGrad,
}

fn values(rng: &mut Rng) -> Vec<f64> {
    let n = 1 + rng.below(4);
    (0..n)
        .map(|_| {
            let sign = if rng.chance(0.5) { -1.0 } else { 1.0 };
            sign * (0.25 + (rng.below(8) as f64) * 0.25)
        })
        .collect()
}

fn step(rng: &mut Rng) -> Step {
    let (x, y) = (rng.below(64), rng.below(64));
    let no_grad = rng.chance(0.2);
    match rng.below(20) {
        0 | 1 => Step::Leaf {
            values: values(rng),
            grad: rng.chance(0.7),
        },
        2..=4 => Step::Unary {
            x,
            kind: rng.pick(&[
                UnaryKind::Neg,
                UnaryKind::Exp,
                UnaryKind::Tanh,
                UnaryKind::Relu,
                UnaryKind::Square,
                UnaryKind::MulScalar(-1.5),
                UnaryKind::DivScalar(4.0),
            ]),
            no_grad,
        },
        5..=7 => Step::Binary {
            x,
            y,
            kind: rng.pick(&[
                BinaryKind::Add,
                BinaryKind::Sub,
                BinaryKind::Mul,
                BinaryKind::Div,
            ]),
            no_grad,
        },
        8 => {
            let hostile = rng.chance(0.2);
            let edge = [0, 1, 4, usize::MAX, usize::MAX / 2 + 1];
            Step::Narrow {
                x,
                start: if hostile {
                    rng.pick(&edge)
                } else {
                    rng.below(4)
                },
                len: if hostile {
                    rng.pick(&edge)
                } else {
                    rng.below(4)
                },
                hostile,
                no_grad,
            }
        }
        9 => Step::Detach(x),
        10 => Step::CopyData(x),
        11 => Step::RequireGrad(x),
        12..=14 => Step::InPlace {
            x,
            write: rng.pick(&[
                Write::AddFrom(y),
                Write::CopyFrom(y),
                Write::MulScalar(0.5),
                Write::Fill(-0.75),
                Write::Relu,
            ]),
            no_grad: rng.chance(0.6),
        },
        15 => Step::IntoRelu(x),
        16 => Step::IntoAdd { x, y },
        17 | 18 => Step::Backward {
            x,
            retain: rng.chance(0.4),
        },
        _ => Step::ZeroGrad,
    }
}

#[derive(Debug, Clone)]
pub struct Program {
    pub steps: Vec<Step>,
}

pub fn generate(rng: &mut Rng) -> Program {
    let mut steps: Vec<Step> = (0..2)
        .map(|_| Step::Leaf {
            values: values(rng),
            grad: true,
        })
        .collect();
    steps.extend((0..4 + rng.below(20)).map(|_| step(rng)));
    steps.push(Step::Backward {
        x: rng.below(64),
        retain: false,
    });
    Program { steps }
}
