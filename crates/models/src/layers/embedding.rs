//! `Embedding`: a lookup table of rows indexed by `i64` ids.

use crate::error::{config_err, input_err};
use crate::functional;
use crate::init;
use crate::trace::{Act, Tracer};
use crate::{layer_casts, module_tree, Layer, Result};
use kiln_autograd::{DType, Module, Parameter, Tensor};

/// `torch.nn.Embedding`: `weight` `[num_embeddings, embedding_dim]` drawn from `N(0, 1)`;
/// an input of ids `[...]` gives `[..., embedding_dim]`.
#[derive(Debug)]
pub struct Embedding {
    /// The table.
    pub weight: Parameter,
    training: bool,
}

impl Embedding {
    /// `Embedding(num_embeddings, embedding_dim)`.
    pub fn new(num_embeddings: usize, embedding_dim: usize) -> Result<Self> {
        if num_embeddings == 0 || embedding_dim == 0 {
            return Err(config_err(
                "Embedding",
                format!(
                    "num_embeddings {num_embeddings} and embedding_dim {embedding_dim} must be positive"
                ),
            ));
        }
        Ok(Embedding {
            weight: init::normal(&[num_embeddings, embedding_dim], 0.0, 1.0)?,
            training: true,
        })
    }

    fn check(&self, shape: &[usize], dtype: DType) -> Result<Vec<usize>> {
        if dtype != DType::I64 {
            return Err(input_err(
                "Embedding",
                format!("ids must be i64, got {dtype}; convert with to_dtype(DType::I64)"),
            ));
        }
        let mut out = shape.to_vec();
        out.push(self.weight.shape()[1]);
        Ok(out)
    }
}

impl Module for Embedding {
    fn own_parameters(&self) -> Vec<(String, Parameter)> {
        vec![("weight".to_string(), self.weight.clone())]
    }
    module_tree!();
}

impl Layer for Embedding {
    fn type_name(&self) -> &'static str {
        "Embedding"
    }
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.check(x.shape(), x.dtype())?;
        functional::embedding(x, &self.weight)
    }
    fn trace(&self, tracer: &mut Tracer, x: &Act) -> Result<Act> {
        let shape = self.check(x.shape(), x.dtype())?;
        // Backward scatters into the table rows named by the ids.
        let trainable = self.weight.requires_grad();
        if trainable {
            tracer.save(x);
        }
        Ok(tracer.output(&[x], &shape, self.weight.dtype(), trainable))
    }
    layer_casts!();
}
