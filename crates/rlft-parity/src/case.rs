//! One parsed case: typed access to its config, inputs and expected outputs.

use crate::{Options, ParityError, Result};
use burn::tensor::{Device, Tensor, TensorData};
use rlft_algo::aggregation::{GlobalBatchInfo, LossAggregation};
use rlft_algo::masked::to_host;
use serde_json::Value;

pub(crate) struct Case<'a> {
    json: &'a Value,
    id: String,
    pub(crate) opts: &'a Options,
    pub(crate) device: Device,
}

impl<'a> Case<'a> {
    pub(crate) fn new(json: &'a Value, opts: &'a Options) -> Result<Self> {
        let id = json
            .get("case_id")
            .and_then(Value::as_str)
            .unwrap_or("<no case_id>")
            .to_string();
        if json.get("schema").and_then(Value::as_str) != Some("rl-golden/v1") {
            return Err(ParityError::Case {
                case: id,
                msg: "schema is not rl-golden/v1".into(),
            });
        }
        Ok(Self {
            json,
            id,
            opts,
            device: opts.device.clone().autodiff(),
        })
    }

    pub(crate) fn err(&self, msg: impl Into<String>) -> ParityError {
        ParityError::Case {
            case: self.id.clone(),
            msg: msg.into(),
        }
    }

    pub(crate) fn algo(&self, e: rlft_algo::AlgoError) -> ParityError {
        ParityError::Algo {
            case: self.id.clone(),
            source: e,
        }
    }

    pub(crate) fn get(&self, path: &[&str]) -> Option<&'a Value> {
        path.iter().try_fold(self.json, |v, k| v.get(*k))
    }

    pub(crate) fn str(&self, path: &[&str]) -> Result<&'a str> {
        self.get(path)
            .and_then(Value::as_str)
            .ok_or_else(|| self.err(format!("missing string {}", path.join("."))))
    }

    pub(crate) fn opt_str(&self, path: &[&str]) -> Option<&'a str> {
        self.get(path).and_then(Value::as_str)
    }

    pub(crate) fn num(&self, path: &[&str]) -> Result<f64> {
        self.get(path)
            .and_then(Value::as_f64)
            .ok_or_else(|| self.err(format!("missing number {}", path.join("."))))
    }

    pub(crate) fn opt_num(&self, path: &[&str]) -> Option<f64> {
        self.get(path).and_then(Value::as_f64)
    }

    /// The reference's `outputs.metrics`.
    pub(crate) fn metrics(&self) -> Option<&'a Value> {
        self.get(&["outputs", "metrics"])
    }

    /// A stored tensor's shape and values (bool/int as 0/1/integers).
    pub(crate) fn raw(&self, group: &str, name: &str) -> Result<(Vec<usize>, Vec<f64>)> {
        let t = self
            .get(&[group, name])
            .ok_or_else(|| self.err(format!("missing {group}.{name}")))?;
        let shape: Vec<usize> = t
            .get("shape")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_u64)
                    .map(|x| x as usize)
                    .collect()
            })
            .ok_or_else(|| self.err(format!("{group}.{name} has no shape")))?;
        let data: Vec<f64> = t
            .get("data")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|x| x.as_f64().or_else(|| x.as_bool().map(f64::from)))
                    .collect()
            })
            .ok_or_else(|| self.err(format!("{group}.{name} has no data")))?;
        if data.len() != shape.iter().product::<usize>() {
            return Err(self.err(format!(
                "{group}.{name}: {} values for shape {shape:?}",
                data.len()
            )));
        }
        Ok((shape, data))
    }

    pub(crate) fn tensor<const D: usize>(&self, name: &str) -> Result<Tensor<D>> {
        let (shape, data) = self.raw("inputs", name)?;
        let dims: [usize; D] = shape
            .try_into()
            .map_err(|s| self.err(format!("inputs.{name}: rank of {s:?} is not {D}")))?;
        Ok(Tensor::from_data(
            TensorData::new(data, dims),
            (&self.device, self.opts.dtype),
        ))
    }

    pub(crate) fn opt_tensor(&self, name: &str) -> Result<Option<Tensor<2>>> {
        if self.get(&["inputs", name]).is_some() {
            self.tensor(name).map(Some)
        } else {
            Ok(None)
        }
    }

    /// The data of an expected output tensor.
    pub(crate) fn want(&self, path: &[&str]) -> Result<Vec<f64>> {
        let t = self
            .get(path)
            .ok_or_else(|| self.err(format!("missing {}", path.join("."))))?;
        t.get("data")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|x| x.as_f64().or_else(|| x.as_bool().map(f64::from)))
                    .collect()
            })
            .ok_or_else(|| self.err(format!("{} has no data", path.join("."))))
    }

    pub(crate) fn agg(&self, path: &[&str]) -> Result<LossAggregation> {
        self.str(path)?.parse().map_err(|e| self.algo(e))
    }

    pub(crate) fn host<const D: usize>(&self, t: &Tensor<D>) -> Result<Vec<f64>> {
        to_host(t).map_err(|e| self.algo(e))
    }

    /// `inputs.response_mask` as a float tensor and on the host.
    pub(crate) fn mask(&self) -> Result<(Tensor<2>, Vec<f64>)> {
        let m = self.tensor::<2>("response_mask")?;
        let v = self.host(&m)?;
        Ok((m, v))
    }

    /// `config.actor.global_batch_info`, local when absent.
    pub(crate) fn global(&self) -> GlobalBatchInfo {
        let g = |k: &str| self.opt_num(&["config", "actor", "global_batch_info", k]);
        GlobalBatchInfo {
            dp_size: g("dp_size").map(|v| v as usize).unwrap_or(1),
            batch_num_tokens: g("batch_num_tokens"),
            global_batch_size: g("global_batch_size"),
            loss_scale_factor: g("loss_scale_factor"),
        }
    }

    /// Compares a loss against `outputs.loss` and its gradient against `outputs.grad.NAME`:
    /// within tolerance where `mask` is set (everywhere without a mask), exactly 0 elsewhere.
    pub(crate) fn loss_and_grad<const D: usize>(
        &self,
        cmp: &mut crate::Compare,
        loss: Tensor<1>,
        leaf: &Tensor<D>,
        name: &str,
        mask: Option<&[f64]>,
    ) -> Result<()> {
        cmp.scalar(
            "loss",
            self.host(&loss)?[0],
            self.num(&["outputs", "loss"])?,
        );
        let g = leaf
            .grad(&loss.backward())
            .ok_or_else(|| self.err(format!("no gradient reached {name}")))?;
        let want = self.want(&["outputs", "grad", name])?;
        cmp.tensor(
            &format!("grad.{name}"),
            &self.host(&g)?,
            &want,
            mask,
            mask.is_some(),
        );
        Ok(())
    }
}
