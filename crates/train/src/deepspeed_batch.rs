//! `--deepspeed`'s batch sizes, resolved as DeepSpeed 0.19's
//! `_set_batch_related_parameters` resolves them for the job's world size:
//! of `train_batch_size`, `train_micro_batch_size_per_gpu` and
//! `gradient_accumulation_steps` the ones given fix the rest, and the three
//! must then multiply out (`train = micro × accumulation × world`). terse
//! keeps the global batch and the micro-batch and derives the
//! accumulation, so the same file gives the same batch in both.

use serde_json::{Map, Value};

use crate::deepspeed_config::{DeepSpeedConfig, integer};

const TRAIN: &str = "train_batch_size";
const MICRO: &str = "train_micro_batch_size_per_gpu";
const ACCUMULATION: &str = "gradient_accumulation_steps";

impl DeepSpeedConfig {
    /// `train.global_batch` and `train.micro_batch` from the batch keys of
    /// `root` on `world` ranks; none of the three keeps the run config's.
    pub(crate) fn batch(
        &mut self,
        path: &str,
        root: &Map<String, Value>,
        world: usize,
    ) -> Result<(), String> {
        let read = |key: &str| -> Result<Option<u64>, String> {
            root.get(key)
                .map(|v| {
                    let n = integer(v, &format!("{path}: `{key}`"))? as u64;
                    if n == 0 {
                        return Err(format!("{path}: `{key}`: has to be greater than 0"));
                    }
                    Ok(n)
                })
                .transpose()
        };
        let world = world.max(1) as u64;
        let (train, micro, accumulation) = match (read(TRAIN)?, read(MICRO)?, read(ACCUMULATION)?) {
            (None, None, None) => return Ok(()),
            (Some(t), Some(m), Some(a)) => (t, m, a),
            (Some(t), Some(m), None) => (t, m, t / m / world),
            (Some(t), None, Some(a)) => (t, t / world / a, a),
            (None, Some(m), Some(a)) => (m * a * world, m, a),
            (Some(t), None, None) => (t, t / world, 1),
            (None, Some(m), None) => (m * world, m, 1),
            (None, None, Some(_)) => {
                return Err(format!(
                    "{path}: `{ACCUMULATION}` alone: DeepSpeed needs `{TRAIN}` or `{MICRO}` \
                     with it, and so does terse"
                ));
            }
        };
        // DeepSpeed's `_batch_assertion`, with its wording.
        if micro == 0 || accumulation == 0 || train != micro * accumulation * world {
            return Err(format!(
                "{path}: `{TRAIN}` is not equal to `{MICRO}` × `{ACCUMULATION}` × world size \
                 ({train} != {micro} × {accumulation} × {world}; the keys given fix the others \
                 as DeepSpeed does)"
            ));
        }
        self.set("train.global_batch", train as i64);
        self.set("train.micro_batch", micro as i64);
        if root.contains_key(ACCUMULATION) {
            self.ignored.push(format!(
                "{ACCUMULATION}: {accumulation} on {world} rank(s), as terse derives it from the \
                 global batch and the micro-batch"
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::deepspeed_config::tests::applied_on;

    /// (global_batch, micro_batch) set, or the error.
    fn resolved(json: &str, world: usize) -> Result<Option<(i64, i64)>, String> {
        let doc = applied_on(json, world)?;
        let get = |key: &str| doc.get("train")?.get(key)?.as_integer();
        Ok(get("global_batch").zip(get("micro_batch")))
    }

    /// DeepSpeed's resolution, worked by hand from
    /// `_set_batch_related_parameters` for 4 ranks.
    #[test]
    fn the_batch_keys_resolve_as_deepspeed_resolves_them() {
        for (json, expected) in [
            (
                r#"{"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 2}"#,
                (64, 8),
            ),
            (
                r#"{"train_batch_size": 64, "gradient_accumulation_steps": 2}"#,
                (64, 8),
            ),
            (
                r#"{"train_batch_size": 64, "train_micro_batch_size_per_gpu": 4}"#,
                (64, 4),
            ),
            (r#"{"train_batch_size": 64}"#, (64, 16)),
            (r#"{"train_micro_batch_size_per_gpu": 8}"#, (32, 8)),
            (
                r#"{"train_batch_size": 64, "train_micro_batch_size_per_gpu": 8,
                    "gradient_accumulation_steps": 2}"#,
                (64, 8),
            ),
        ] {
            assert_eq!(resolved(json, 4), Ok(Some(expected)), "{json}");
        }
        assert_eq!(resolved("{}", 4), Ok(None));
    }

    #[test]
    fn batch_keys_that_do_not_multiply_out_are_refused_as_deepspeed_refuses_them() {
        for json in [
            r#"{"train_batch_size": 64, "train_micro_batch_size_per_gpu": 8,
                "gradient_accumulation_steps": 4}"#,
            // 64 / 3 / 8 rounds down, as DeepSpeed's `//` does, and fails.
            r#"{"train_batch_size": 64, "train_micro_batch_size_per_gpu": 8}"#,
        ] {
            let error = resolved(json, 3).unwrap_err();
            assert!(error.contains("is not equal to"), "{json}: {error}");
        }
        let alone = resolved(r#"{"gradient_accumulation_steps": 2}"#, 1).unwrap_err();
        assert!(alone.contains("alone"), "{alone}");
        let zero = resolved(r#"{"train_batch_size": 0}"#, 1).unwrap_err();
        assert!(
            zero.contains("`train_batch_size`: has to be greater than 0"),
            "{zero}"
        );
    }
}
