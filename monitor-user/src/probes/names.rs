//! Names of kernel enum values, read from BTF so they are the running kernel's: event types,
//! QP states, rdma_cm events, reject reasons, work-completion statuses.

use std::collections::BTreeMap;

use crate::btf::Btf;

/// value -> short name for one kernel enum (its common prefix removed).
#[derive(Clone, Debug, Default)]
pub struct EnumNames {
    names: BTreeMap<i64, String>,
}

impl EnumNames {
    /// The enum `name` with `prefix` stripped from each enumerator; empty if this BTF lacks it.
    pub fn from_btf(btf: &Btf, name: &str, prefix: &str) -> Self {
        let names = btf
            .enum_values(name)
            .map(|values| {
                values
                    .into_iter()
                    .map(|(n, v)| (v, n.strip_prefix(prefix).unwrap_or(&n).to_owned()))
                    .collect()
            })
            .unwrap_or_default();
        Self { names }
    }

    pub fn from_pairs<'a>(pairs: impl IntoIterator<Item = (i64, &'a str)>) -> Self {
        Self {
            names: pairs.into_iter().map(|(v, n)| (v, n.to_owned())).collect(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// The name of `value`, or the number itself when the kernel does not define it.
    pub fn name(&self, value: i64) -> String {
        self.names
            .get(&value)
            .cloned()
            .unwrap_or_else(|| value.to_string())
    }

    fn merge(&mut self, other: &EnumNames) {
        if self.names.is_empty() {
            self.names = other.names.clone();
        }
    }
}

/// Every enum the decoder names, collected from whichever module BTF had it.
#[derive(Clone, Debug, Default)]
pub struct KernelNames {
    pub ib_event: EnumNames,
    pub qp_state: EnumNames,
    pub cm_event: EnumNames,
    pub cm_reject: EnumNames,
    pub wc_status: EnumNames,
}

impl KernelNames {
    pub fn from_btf(btf: &Btf) -> Self {
        Self {
            ib_event: EnumNames::from_btf(btf, "ib_event_type", "IB_EVENT_"),
            qp_state: EnumNames::from_btf(btf, "ib_qp_state", "IB_QPS_"),
            cm_event: EnumNames::from_btf(btf, "rdma_cm_event_type", "RDMA_CM_EVENT_"),
            cm_reject: EnumNames::from_btf(btf, "ib_cm_rej_reason", "IB_CM_REJ_"),
            wc_status: EnumNames::from_btf(btf, "ib_wc_status", "IB_WC_"),
        }
    }

    /// Fills the tables this one lacks from `other`.
    pub fn merge(&mut self, other: &KernelNames) {
        self.ib_event.merge(&other.ib_event);
        self.qp_state.merge(&other.qp_state);
        self.cm_event.merge(&other.cm_event);
        self.cm_reject.merge(&other.cm_reject);
        self.wc_status.merge(&other.wc_status);
    }
}
