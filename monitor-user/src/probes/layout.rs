//! From the running kernel's BTF and tracefs to the globals each probe family needs.
//!
//! Each function reads one module's view (vmlinux plus that module's split BTF: module BTFs
//! are based on vmlinux only, so ib_uverbs' structs are looked up in ib_uverbs' BTF).

use std::path::Path;

use monitor_common::{
    events::NameSource,
    globals as g,
    verbs::{NO_DEVICE, RESTRACK_TYPES, Verb},
};

use crate::{
    btf::{Btf, BtfError, Shape},
    tracefs::{Tracefs, TracefsError},
};

/// The globals of one layout, from the module's BTF (vmlinux + its split BTF) and tracefs.
pub(super) fn resolve(
    layout: super::Layout,
    btf: &Btf,
    tracefs: Result<&Tracefs, &str>,
    kallsyms: &Path,
) -> Result<Globals, LayoutError> {
    use super::Layout as L;
    let with_name = |mut globals: Globals| -> Result<Globals, BtfError> {
        globals.extend(device_name(btf)?);
        Ok(globals)
    };
    let tracefs = || tracefs.map_err(|e| LayoutError::NoTracefs(e.to_owned()));
    Ok(match layout {
        L::IbEvent => ib_event(btf)?,
        L::Restrack => with_name(restrack(btf)?)?,
        L::ModifyQp => with_name(modify_qp(btf)?)?,
        L::Uverbs => uverbs(btf)?,
        L::Device => device_name(btf)?,
        L::Mad => mad(tracefs()?)?,
        L::RdmaCm => rdma_cm(btf, kallsyms)?,
    })
}

/// A value for one global of the eBPF object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum GlobalValue {
    U32(u32),
    U64(u64),
    U32s([u32; RESTRACK_TYPES]),
    I32s([i32; RESTRACK_TYPES]),
}

pub(super) type Globals = Vec<(&'static str, GlobalValue)>;

fn u32g(name: &'static str, v: u32) -> (&'static str, GlobalValue) {
    (name, GlobalValue::U32(v))
}

/// Offsets in `struct ib_event` and how to read an `ib_device`'s name.
pub(super) fn ib_event(btf: &Btf) -> Result<Globals, BtfError> {
    let element = btf.field("ib_event", "element.port_num")?;
    let mut globals = vec![
        u32g(
            g::IB_EVENT_DEVICE_OFFSET,
            btf.field("ib_event", "device")?.offset,
        ),
        u32g(g::IB_EVENT_ELEMENT_OFFSET, element.offset),
        u32g(g::IB_EVENT_PORT_SIZE, element.size),
        u32g(
            g::IB_EVENT_TYPE_OFFSET,
            btf.field("ib_event", "event")?.offset,
        ),
    ];
    globals.extend(device_name(btf)?);
    Ok(globals)
}

/// The device's identity (`ib_device.index`) and where its name is: the inline
/// `ib_device.name` array, or `dev.kobj.name` on kernels without it.
pub(super) fn device_name(btf: &Btf) -> Result<Globals, BtfError> {
    let (source, offset) = match btf.field("ib_device", "name") {
        Ok(f) if matches!(f.shape, Shape::Array { elem_size: 1, .. }) => {
            (NameSource::InlineArray, f.offset)
        }
        _ => (
            NameSource::Pointer,
            btf.field("ib_device", "dev.kobj.name")?.offset,
        ),
    };
    Ok(vec![
        u32g(g::IB_DEVICE_NAME_SOURCE, source as u32),
        u32g(g::IB_DEVICE_NAME_OFFSET, offset),
        u32g(
            g::IB_DEVICE_INDEX_OFFSET,
            btf.field("ib_device", "index")?.offset,
        ),
    ])
}

/// `struct ib_qp` and the QP state values `ib_modify_qp_with_udata` needs.
pub(super) fn modify_qp(btf: &Btf) -> Result<Globals, BtfError> {
    Ok(vec![
        u32g(g::IB_QP_DEVICE_OFFSET, btf.field("ib_qp", "device")?.offset),
        u32g(g::IB_QP_NUM_OFFSET, btf.field("ib_qp", "qp_num")?.offset),
        u32g(
            g::QP_ATTR_STATE_OFFSET,
            btf.field("ib_qp_attr", "qp_state")?.offset,
        ),
        u32g(
            g::QP_ATTR_MASK_STATE,
            btf.enum_value("ib_qp_attr_mask", "IB_QP_STATE")? as u32,
        ),
        u32g(
            g::QP_STATE_ERR,
            btf.enum_value("ib_qp_state", "IB_QPS_ERR")? as u32,
        ),
    ])
}

/// The resource tracker: per `enum rdma_restrack_type`, the verbs to count and where the
/// embedding object keeps its device.
pub(super) fn restrack(btf: &Btf) -> Result<Globals, BtfError> {
    let mut add = [Verb::None as u32; RESTRACK_TYPES];
    let mut del = [Verb::None as u32; RESTRACK_TYPES];
    let mut delta = [NO_DEVICE; RESTRACK_TYPES];
    // (enumerator, created verb, destroyed verb, embedding struct with `res` and `device`).
    // PD/CQ/QP/MR/SRQ destruction is counted at their destroy functions instead (Verb::None
    // here): rdma_restrack_del is not called for all of them on every kernel (6.1 skips it
    // for user PDs, CQs and QPs), and nothing may be counted twice.
    let table: [(&str, Verb, Verb, Option<&str>); 7] = [
        ("RDMA_RESTRACK_PD", Verb::PdAlloc, Verb::None, Some("ib_pd")),
        (
            "RDMA_RESTRACK_CQ",
            Verb::CqCreate,
            Verb::None,
            Some("ib_cq"),
        ),
        (
            "RDMA_RESTRACK_QP",
            Verb::QpCreate,
            Verb::None,
            Some("ib_qp"),
        ),
        ("RDMA_RESTRACK_MR", Verb::MrReg, Verb::None, Some("ib_mr")),
        (
            "RDMA_RESTRACK_SRQ",
            Verb::SrqCreate,
            Verb::None,
            Some("ib_srq"),
        ),
        (
            "RDMA_RESTRACK_CTX",
            Verb::ContextCreate,
            Verb::ContextDestroy,
            Some("ib_ucontext"),
        ),
        // rdma_id_private lives in rdma_cm, and its device is unset until the id is bound.
        (
            "RDMA_RESTRACK_CM_ID",
            Verb::CmIdCreate,
            Verb::CmIdDestroy,
            None,
        ),
    ];
    for (enumerator, created, destroyed, owner) in table {
        let Ok(value) = btf.enum_value("rdma_restrack_type", enumerator) else {
            continue; // not on this kernel: nothing to count
        };
        let Some(slot) = usize::try_from(value).ok().filter(|v| *v < RESTRACK_TYPES) else {
            continue;
        };
        add[slot] = created as u32;
        del[slot] = destroyed as u32;
        if let Some(owner) = owner {
            let res = btf.field(owner, "res")?.offset as i64;
            let device = btf.field(owner, "device")?.offset as i64;
            delta[slot] = (device - res) as i32;
        }
    }
    Ok([
        u32g(g::IB_PD_DEVICE_OFFSET, btf.field("ib_pd", "device")?.offset),
        u32g(g::IB_CQ_DEVICE_OFFSET, btf.field("ib_cq", "device")?.offset),
        u32g(g::IB_QP_DEVICE_OFFSET, btf.field("ib_qp", "device")?.offset),
        u32g(g::IB_MR_DEVICE_OFFSET, btf.field("ib_mr", "device")?.offset),
        u32g(
            g::IB_SRQ_DEVICE_OFFSET,
            btf.field("ib_srq", "device")?.offset,
        ),
        u32g(
            g::RESTRACK_TYPE_OFFSET,
            btf.field("rdma_restrack_entry", "type")?.offset,
        ),
        u32g(
            g::RESTRACK_USER_OFFSET,
            btf.field("rdma_restrack_entry", "user")?.offset,
        ),
        u32g(
            g::RESTRACK_VALID_OFFSET,
            btf.field("rdma_restrack_entry", "valid")?.offset,
        ),
        u32g(
            g::RESTRACK_TASK_OFFSET,
            btf.field("rdma_restrack_entry", "task")?.offset,
        ),
        (g::RESTRACK_ADD_VERB, GlobalValue::U32s(add)),
        (g::RESTRACK_DEL_VERB, GlobalValue::U32s(del)),
        (g::RESTRACK_DEVICE_DELTA, GlobalValue::I32s(delta)),
    ]
    .into_iter()
    .chain(task_cgroup(btf)?)
    .collect())
}

/// ib_uverbs' view: the attr bundle's user context, and the QP/CQ layouts for async events.
pub(super) fn uverbs(btf: &Btf) -> Result<Globals, BtfError> {
    let mut globals = vec![
        u32g(
            g::ATTRS_UFILE_OFFSET,
            btf.field("uverbs_attr_bundle", "ufile")?.offset,
        ),
        u32g(
            g::UFILE_UCONTEXT_OFFSET,
            btf.field("ib_uverbs_file", "ucontext")?.offset,
        ),
        u32g(
            g::UCONTEXT_DEVICE_OFFSET,
            btf.field("ib_ucontext", "device")?.offset,
        ),
        u32g(g::IB_CQ_DEVICE_OFFSET, btf.field("ib_cq", "device")?.offset),
        u32g(g::IB_QP_DEVICE_OFFSET, btf.field("ib_qp", "device")?.offset),
        u32g(g::IB_QP_NUM_OFFSET, btf.field("ib_qp", "qp_num")?.offset),
        u32g(
            g::IB_CQ_OWNER_OFFSET,
            btf.field("ib_cq", "res.task")?.offset,
        ),
        u32g(
            g::IB_QP_OWNER_OFFSET,
            btf.field("ib_qp", "res.task")?.offset,
        ),
    ];
    globals.extend(task_cgroup(btf)?);
    globals.extend(ib_event(btf)?);
    Ok(globals)
}

/// From a `struct task_struct *` to the id of its cgroup (v2): what
/// `bpf_get_current_cgroup_id` gives for the current task.
pub(super) fn task_cgroup(btf: &Btf) -> Result<Globals, BtfError> {
    Ok(vec![
        u32g(
            g::TASK_CGROUPS_OFFSET,
            btf.field("task_struct", "cgroups")?.offset,
        ),
        u32g(
            g::CSS_SET_DFL_CGRP_OFFSET,
            btf.field("css_set", "dfl_cgrp")?.offset,
        ),
        u32g(g::CGROUP_KN_OFFSET, btf.field("cgroup", "kn")?.offset),
        u32g(
            g::KERNFS_NODE_ID_OFFSET,
            btf.field("kernfs_node", "id")?.offset,
        ),
    ])
}

/// rdma_cm's view for the `cm_event_handler` raw tracepoint: where an id keeps its handler,
/// the address of rdma_cm's internal `cma_listen_handler` (from kallsyms: a static function),
/// and `struct rdma_cm_event`.
pub(super) fn rdma_cm(btf: &Btf, kallsyms: &Path) -> Result<Globals, LayoutError> {
    let rejected = btf.enum_value("rdma_cm_event_type", "RDMA_CM_EVENT_REJECTED")? as u32;
    let listen_handler = crate::kernel::module_symbol(kallsyms, "rdma_cm", "cma_listen_handler")
        .map_err(LayoutError::Symbol)?;
    Ok(vec![
        u32g(
            g::CM_ID_HANDLER_OFFSET,
            btf.field("rdma_id_private", "id.event_handler")?.offset,
        ),
        (g::CM_LISTEN_HANDLER, GlobalValue::U64(listen_handler)),
        u32g(
            g::CM_EVENT_OFFSET,
            btf.field("rdma_cm_event", "event")?.offset,
        ),
        u32g(
            g::CM_STATUS_OFFSET,
            btf.field("rdma_cm_event", "status")?.offset,
        ),
        u32g(g::CM_EVENT_REJECTED, rejected),
    ])
}

/// `ib_mad:ib_mad_send_done_handler` record layout.
pub(super) fn mad(tracefs: &Tracefs) -> Result<Globals, LayoutError> {
    let status = tracefs.field("ib_mad", "ib_mad_send_done_handler", "wc_status")?;
    Ok(vec![u32g(g::MAD_WC_STATUS_FIELD_OFFSET, status.offset)])
}

#[derive(Debug, thiserror::Error)]
pub(super) enum LayoutError {
    #[error(transparent)]
    Btf(#[from] BtfError),
    #[error(transparent)]
    Tracefs(#[from] TracefsError),
    #[error("{0}")]
    NoTracefs(String),
    #[error("{0}")]
    Symbol(String),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probes::{Family, Layout};

    /// Inside the test bed (RDMA modules loaded): every layout resolves from the real module
    /// BTF and tracefs and sets every global its programs read.
    #[test]
    #[ignore = "needs ib_core, ib_uverbs and rdma_cm: runs inside the soft-RoCE test bed"]
    fn ib_core_layouts_cover_required_globals() {
        let tracefs = Tracefs::find_or_mount(std::path::Path::new("/sys")).unwrap();
        for family in Family::ALL {
            let btf = Btf::from_sys_fs(Some(family.module())).unwrap();
            let layouts: std::collections::BTreeSet<Layout> =
                family.probes().map(|p| p.layout).collect();
            for layout in layouts {
                let kallsyms = Path::new("/proc/kallsyms");
                let globals = resolve(layout, &btf, Ok(&tracefs), kallsyms)
                    .unwrap_or_else(|e| panic!("{family:?}/{layout:?}: {e}"));
                for required in layout.required_globals() {
                    assert!(
                        globals.iter().any(|(name, _)| name == required),
                        "{family:?}/{layout:?} does not set {required}"
                    );
                }
            }
        }
    }

    #[test]
    fn every_layout_is_used_by_some_probe() {
        for layout in Layout::ALL {
            assert!(
                crate::probes::CATALOGUE.iter().any(|p| p.layout == layout),
                "{layout:?}"
            );
        }
    }
}
