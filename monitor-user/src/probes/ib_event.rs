//! The IB event probe: a kprobe on ib_core's `ib_dispatch_event`, which every RDMA driver calls
//! for port up/down, device fatal, LID/PKEY/GID changes.
//!
//! This module knows the kernel's types: it resolves `struct ib_event` and `struct ib_device`
//! from BTF into the globals the eBPF program reads, and turns raw records back into named
//! events with the kernel's own `enum ib_event_type`.

use std::collections::BTreeMap;

use monitor_common::{
    globals,
    ib_event::{DEVICE_NAME_LEN, IbEventRecord, NameSource},
};
use serde::Serialize;

use crate::btf::{Btf, BtfError, Shape};

/// Where `ib_dispatch_event`'s argument keeps what we read, on the running kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IbEventLayout {
    pub device_offset: u32,
    pub port_offset: u32,
    /// 1 before Linux 5.13 (`u8 port_num`), 4 since.
    pub port_size: u32,
    pub type_offset: u32,
    pub name_source: NameSource,
    pub name_offset: u32,
}

impl IbEventLayout {
    /// Resolves the layout from BTF that includes ib_core's types.
    pub fn from_btf(btf: &Btf) -> Result<Self, BtfError> {
        let device = btf.field("ib_event", "device")?;
        let port = btf.field("ib_event", "element.port_num")?;
        let event = btf.field("ib_event", "event")?;
        let (name_source, name_offset) = match btf.field("ib_device", "name") {
            Ok(f) if matches!(f.shape, Shape::Array { elem_size: 1, .. }) => {
                (NameSource::InlineArray, f.offset)
            }
            // Kernels without the inline array: the name lives in the embedded struct device.
            _ => (
                NameSource::Pointer,
                btf.field("ib_device", "dev.kobj.name")?.offset,
            ),
        };
        Ok(Self {
            device_offset: device.offset,
            port_offset: port.offset,
            port_size: port.size,
            type_offset: event.offset,
            name_source,
            name_offset,
        })
    }

    /// The globals to hand to `EbpfLoader::override_global`, by name.
    pub fn globals(&self) -> [(&'static str, u32); 6] {
        [
            (globals::IB_EVENT_DEVICE_OFFSET, self.device_offset),
            (globals::IB_EVENT_PORT_OFFSET, self.port_offset),
            (globals::IB_EVENT_PORT_SIZE, self.port_size),
            (globals::IB_EVENT_TYPE_OFFSET, self.type_offset),
            (globals::IB_DEVICE_NAME_SOURCE, self.name_source as u32),
            (globals::IB_DEVICE_NAME_OFFSET, self.name_offset),
        ]
    }
}

/// Names of `enum ib_event_type` values as the running kernel defines them, without the
/// `IB_EVENT_` prefix (PORT_ACTIVE, PORT_ERR, ...).
#[derive(Clone, Debug, Default)]
pub struct IbEventNames {
    names: BTreeMap<u32, String>,
}

impl IbEventNames {
    pub fn from_btf(btf: &Btf) -> Result<Self, BtfError> {
        let names = btf
            .enum_values("ib_event_type")?
            .into_iter()
            .filter_map(|(name, value)| {
                let value = u32::try_from(value).ok()?;
                let short = name.strip_prefix("IB_EVENT_").unwrap_or(&name).to_owned();
                Some((value, short))
            })
            .collect();
        Ok(Self { names })
    }

    /// The name of a raw value; values this kernel does not define read `UNKNOWN_<n>`.
    pub fn name(&self, value: u32) -> String {
        self.names
            .get(&value)
            .cloned()
            .unwrap_or_else(|| format!("UNKNOWN_{value}"))
    }
}

/// One IB event, decoded.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct IbEvent {
    /// Kernel CLOCK_MONOTONIC nanoseconds at dispatch.
    pub ktime_ns: u64,
    /// Wall-clock nanoseconds since the Unix epoch, derived from `ktime_ns`.
    pub unix_ns: u64,
    pub device: String,
    pub port: u32,
    /// The event's name from the kernel's `enum ib_event_type`, e.g. `PORT_ERR`.
    pub event: String,
    /// The raw enum value.
    pub code: u32,
    /// True when the probe could not read every field (the record is partial).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub partial: bool,
}

impl IbEvent {
    pub fn decode(record: &IbEventRecord, names: &IbEventNames, unix_ns: u64) -> Self {
        debug_assert!(record.device_name.len() == DEVICE_NAME_LEN);
        Self {
            ktime_ns: record.timestamp_ns,
            unix_ns,
            device: record.device_name().to_owned(),
            port: record.port,
            event: names.name(record.event_type),
            code: record.event_type,
            partial: record.read_error != 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(event_type: u32, port: u32, name: &str) -> IbEventRecord {
        let mut device_name = [0u8; DEVICE_NAME_LEN];
        device_name[..name.len()].copy_from_slice(name.as_bytes());
        IbEventRecord {
            timestamp_ns: 42,
            event_type,
            port,
            read_error: 0,
            _pad: 0,
            device_name,
        }
    }

    #[test]
    fn decodes_names_from_the_kernel_enum() {
        let names = IbEventNames {
            names: [(9, "PORT_ACTIVE".into()), (10, "PORT_ERR".into())].into(),
        };
        let event = IbEvent::decode(&record(10, 1, "rxe0"), &names, 7);
        assert_eq!(event.event, "PORT_ERR");
        assert_eq!(event.device, "rxe0");
        assert_eq!(event.port, 1);
        assert_eq!(event.ktime_ns, 42);
        assert_eq!(event.unix_ns, 7);
        assert_eq!(
            IbEvent::decode(&record(99, 1, "x"), &names, 0).event,
            "UNKNOWN_99"
        );
    }

    #[test]
    fn record_survives_the_ring_buffer_bytes() {
        let rec = record(9, 2, "mlx5_0");
        // SAFETY: IbEventRecord is plain old data.
        let bytes = unsafe {
            std::slice::from_raw_parts(
                (&rec as *const IbEventRecord).cast::<u8>(),
                size_of::<IbEventRecord>(),
            )
        };
        let back = IbEventRecord::from_bytes(bytes).unwrap();
        assert_eq!(back.device_name(), "mlx5_0");
        assert_eq!(back.port, 2);
        assert!(IbEventRecord::from_bytes(&bytes[..10]).is_none());
    }
}
