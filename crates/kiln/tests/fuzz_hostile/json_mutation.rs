//! JSON state mutated for the fuzz targets: [`mutate`] (a value replaced by a hostile one:
//! zeros, signs, extremes, non-numbers, wrong types; a number scaled; a list cut or grown) for
//! the state-dict targets, and the walk it is built on ([`paths`], [`at`]), which the checkpoint
//! suite (`fuzz_checkpoints.rs`) uses for its own mutations of a checkpoint's metadata.

use crate::harness::Rng;
use serde_json::{json, Value};

/// Values that break naive code: zeros, signs, extremes, non-numbers, wrong types.
fn hostile_value(rng: &mut Rng) -> Value {
    match rng.below(20) {
        0 => json!(0),
        1 => json!(-1),
        2 => json!(1e308),
        3 => json!(-1e308),
        4 => json!(5e-324),
        5 => json!(i64::MAX),
        6 => json!(i64::MIN),
        7 => json!(u64::MAX),
        8 => json!((1u64 << 53) + 1),
        9 => json!("nan"),
        10 => json!("inf"),
        11 => json!("-inf"),
        12 => Value::Null,
        13 => json!([]),
        14 => json!([0.1]),
        15 => json!([0.1, 0.2, 0.3]),
        16 => json!(true),
        17 => json!({}),
        18 => json!(-0.0),
        _ => json!(rng.next_u64() as f64 / u64::MAX as f64 * 4.0 - 2.0),
    }
}

/// Paths to every value in `v` (object keys and array indices).
pub fn paths(v: &Value, prefix: &mut Vec<Value>, out: &mut Vec<Vec<Value>>) {
    out.push(prefix.clone());
    match v {
        Value::Object(map) => {
            for (k, child) in map {
                prefix.push(json!(k));
                paths(child, prefix, out);
                prefix.pop();
            }
        }
        Value::Array(items) => {
            for (i, child) in items.iter().enumerate() {
                prefix.push(json!(i));
                paths(child, prefix, out);
                prefix.pop();
            }
        }
        _ => {}
    }
}

/// The value at `path` under `v`, if there is one (a path of [`paths`] always is, until `v`
/// changes shape).
pub fn at<'a>(v: &'a mut Value, path: &[Value]) -> Option<&'a mut Value> {
    path.iter().try_fold(v, |v, key| match key {
        Value::String(k) => v.as_object_mut()?.get_mut(k.as_str()),
        key => v.as_array_mut()?.get_mut(key.as_u64()? as usize),
    })
}

/// One to three mutations: replace a value, scale a number, cut or grow a list.
pub fn mutate(state: &mut Value, rng: &mut Rng) {
    for _ in 0..1 + rng.below(3) {
        let mut all = Vec::new();
        paths(state, &mut Vec::new(), &mut all);
        // Skip the root and the scheduler tag most of the time, so most cases reach the checks.
        let path = rng.pick(&all[1..]);
        let target = at(state, &path).expect("a path of the current state");
        match (rng.below(4), &mut *target) {
            (0, Value::Number(n)) => {
                let x = n.as_f64().unwrap_or(1.0) * rng.pick(&[-1.0, 0.0, 1e300, 1e-300, 2.0]);
                *target = json!(x);
            }
            (1, Value::Array(items)) if !items.is_empty() => {
                if rng.chance(0.5) {
                    items.truncate(rng.below(items.len()));
                } else {
                    let first = items[0].clone();
                    items.push(first);
                }
            }
            _ => *target = hostile_value(rng),
        }
    }
}
