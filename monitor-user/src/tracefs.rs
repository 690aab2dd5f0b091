//! Tracepoint formats from tracefs: the byte offset of each field of an event's record, read
//! from `events/<system>/<event>/format`, so tracepoint programs hard-code no layout either.

use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub(crate) enum TracefsError {
    #[error("tracefs is not mounted (looked in /sys/kernel/tracing and /sys/kernel/debug/tracing)")]
    NotMounted,
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: no field {field:?}")]
    NoField { path: PathBuf, field: String },
}

/// A mounted tracefs.
#[derive(Clone, Debug)]
pub(crate) struct Tracefs {
    root: PathBuf,
}

/// Offset and size of one field of a tracepoint record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TraceField {
    pub offset: u32,
    pub size: u32,
}

impl Tracefs {
    /// Finds tracefs under `sys`, mounting it at `<sys>/kernel/tracing` when it is not
    /// mounted yet (aya's tracepoint attach needs it; systemd normally mounts it).
    pub(crate) fn find_or_mount(sys: &Path) -> Result<Self, TracefsError> {
        let candidates = [sys.join("kernel/tracing"), sys.join("kernel/debug/tracing")];
        if let Some(root) = candidates.iter().find(|c| c.join("events").is_dir()) {
            return Ok(Self { root: root.clone() });
        }
        let target = &candidates[0];
        if sys == Path::new("/sys") && target.is_dir() && mount_tracefs(target) {
            tracing::info!("mounted tracefs at {}", target.display());
            return Ok(Self {
                root: target.clone(),
            });
        }
        Err(TracefsError::NotMounted)
    }

    #[cfg(test)]
    pub(crate) fn at(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    /// True when the tracepoint exists (its module is loaded).
    pub(crate) fn has_event(&self, system: &str, event: &str) -> bool {
        self.root.join("events").join(system).join(event).is_dir()
    }

    /// The offset and size of `field` in the records of `system:event`.
    pub(crate) fn field(
        &self,
        system: &str,
        event: &str,
        field: &str,
    ) -> Result<TraceField, TracefsError> {
        let path = self
            .root
            .join("events")
            .join(system)
            .join(event)
            .join("format");
        let text = std::fs::read_to_string(&path).map_err(|source| TracefsError::Io {
            path: path.clone(),
            source,
        })?;
        parse_field(&text, field).ok_or(TracefsError::NoField {
            path,
            field: field.to_owned(),
        })
    }
}

fn mount_tracefs(target: &Path) -> bool {
    let Ok(target) = std::ffi::CString::new(target.as_os_str().as_encoded_bytes()) else {
        return false;
    };
    // SAFETY: valid NUL-terminated strings; no mount data.
    unsafe {
        libc::mount(
            c"nodev".as_ptr(),
            target.as_ptr(),
            c"tracefs".as_ptr(),
            0,
            std::ptr::null(),
        ) == 0
    }
}

/// Finds `field:<type> <name>;\toffset:N;\tsize:M;` in a format file.
fn parse_field(format: &str, name: &str) -> Option<TraceField> {
    format.lines().find_map(|line| {
        let mut parts = line.trim().split(';').map(str::trim);
        let decl = parts.next()?.strip_prefix("field:")?;
        // The name is the last word of the declaration, before any array suffix.
        let declared = decl.rsplit(' ').next()?.split('[').next()?;
        if declared != name {
            return None;
        }
        let mut offset = None;
        let mut size = None;
        for part in parts {
            if let Some(v) = part.strip_prefix("offset:") {
                offset = v.parse().ok();
            } else if let Some(v) = part.strip_prefix("size:") {
                size = v.parse().ok();
            }
        }
        Some(TraceField {
            offset: offset?,
            size: size?,
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const CM_EVENT_HANDLER: &str = "name: cm_event_handler\nID: 1234\nformat:\n\
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\
\tfield:u32 cm_id;\toffset:8;\tsize:4;\tsigned:0;\n\
\tfield:unsigned long event;\toffset:16;\tsize:8;\tsigned:0;\n\
\tfield:int status;\toffset:24;\tsize:4;\tsigned:1;\n\
\tfield:unsigned char srcaddr[28];\toffset:28;\tsize:28;\tsigned:0;\n";

    #[test]
    fn finds_fields_by_name() {
        let f = |n| parse_field(CM_EVENT_HANDLER, n);
        assert_eq!(
            f("event"),
            Some(TraceField {
                offset: 16,
                size: 8
            })
        );
        assert_eq!(
            f("status"),
            Some(TraceField {
                offset: 24,
                size: 4
            })
        );
        assert_eq!(
            f("srcaddr"),
            Some(TraceField {
                offset: 28,
                size: 28
            })
        );
        assert_eq!(f("tos"), None);
    }

    #[test]
    fn missing_format_names_the_file() {
        let dir = std::env::temp_dir().join(format!("railscope-tracefs-{}", std::process::id()));
        let t = Tracefs::at(&dir);
        let err = t
            .field("rdma_cma", "cm_event_handler", "event")
            .unwrap_err();
        assert!(
            err.to_string().contains("rdma_cma/cm_event_handler/format"),
            "{err}"
        );
        std::fs::create_dir_all(dir.join("events/rdma_cma/cm_event_handler")).unwrap();
        std::fs::write(
            dir.join("events/rdma_cma/cm_event_handler/format"),
            CM_EVENT_HANDLER,
        )
        .unwrap();
        assert!(t.has_event("rdma_cma", "cm_event_handler"));
        assert_eq!(
            t.field("rdma_cma", "cm_event_handler", "status")
                .unwrap()
                .offset,
            24
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
