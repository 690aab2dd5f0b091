//! The names the agent and the collector share: the metric names the agent sends
//! ([`metric`], all of them in [`AGENT_METRICS`]) and the kinds of the events it sends
//! ([`event_kind`], all of them in [`EVENT_KINDS`]). The agent's sources emit these constants
//! and the collector's rules, straggler search, `select` and dashboard read them, so a name
//! has one spelling; the collector serves them to its page (`/ui/names.js`).
//!
//! The agent's own InfiniBand counters are named after the sysfs files it finds
//! (`railscope_ib_<file>_total`, [`metric::IB_PREFIX`]): a file this list does not know (new
//! firmware, another driver) is still sent, under the same scheme. [`metric::IB_COUNTER_FILES`]
//! is every counter file of the kernel's `counters/` (IB PMA) and of the mlx5 and rxe
//! `hw_counters/` the agent's fixture trees hold (taken from real adapters); a `hw_counters/`
//! file named like a `counters/` file of the same port is sent as
//! `railscope_ib_hw_<file>_total` (none of the known drivers has one).
//!
//! The ethtool statistics of RoCE ports' netdevs are passed through the same way
//! (`railscope_ethtool_<stat>_total`, [`metric::ETHTOOL_PREFIX`]); [`metric::ETHTOOL_STATS`]
//! lists the mlx5 ones the collector's rules read (PFC pause frames and durations per
//! priority) and a few an operator looks at beside them (ECN marks, physical-port discards).

/// Metric names, one constant each, with kind, unit and labels. Every GPU series also carries
/// `gpu` and `uuid`; every IB port series `device` and `port` (a device-level counter only
/// `device`).
pub mod metric {
    macro_rules! metrics {
        (
            fixed { $( $(#[doc = $doc:literal])* $name:ident = $value:literal; )* }
            ib_counters { $( $ib:ident = $file:literal; )* }
            ethtool_stats { $( $eth:ident = $stat:literal; )* }
        ) => {
            $( $(#[doc = $doc])* pub const $name: &str = $value; )*
            $(
                #[doc = concat!("Counter: the sysfs counter file `", $file, "` of an IB device or port.")]
                pub const $ib: &str = concat!("railscope_ib_", $file, "_total");
            )*
            $(
                #[doc = concat!("Counter: the ethtool statistic `", $stat, "` of a RoCE port's netdev.")]
                pub const $eth: &str = concat!("railscope_ethtool_", $stat, "_total");
            )*

            /// Every metric name the agent can send (each constant of this module), in
            /// declaration order: the fixed names, then one per [`IB_COUNTER_FILES`] entry,
            /// then one per [`ETHTOOL_STATS`] entry.
            pub const AGENT_METRICS: &[&str] = &[$($name,)* $($ib,)* $($eth,)*];

            /// Every metric name the agent can send with its description (the constant's doc
            /// comment, a leading space and all): what [`help`] answers.
            const DESCRIBED: &[(&str, &str)] = &[
                $(($name, concat!($($doc),*)),)*
                $(($ib, concat!(" Counter: the sysfs counter file `", $file, "` of an IB device or port.")),)*
                $(($eth, concat!(" Counter: the ethtool statistic `", $stat, "` of a RoCE port's netdev.")),)*
            ];

            /// Every constant of this module as (constant name, metric name): what the
            /// collector serves its page.
            pub const ALL: &[(&str, &str)] = &[
                $((stringify!($name), $name),)*
                $((stringify!($ib), $ib),)*
                $((stringify!($eth), $eth),)*
            ];

            /// The IB counter files the agent is known to find (see the module's doc), as
            /// named in sysfs lowercased; each gives `railscope_ib_<file>_total`.
            pub const IB_COUNTER_FILES: &[&str] = &[$($file,)*];

            /// The ethtool statistics of mlx5 netdevs the collector reads (see the module's
            /// doc), as the driver names them; each gives `railscope_ethtool_<stat>_total`.
            pub const ETHTOOL_STATS: &[&str] = &[$($stat,)*];
        };
    }

    /// The prefix of every InfiniBand series name: `railscope_ib_<file>_total` for a counter
    /// file (lowercased, characters outside `[a-z0-9_]` as `_`, a trailing `_total` not
    /// doubled).
    pub const IB_PREFIX: &str = "railscope_ib_";
    /// The prefix of every ethtool series name: `railscope_ethtool_<stat>_total` for a
    /// statistic of a RoCE port's netdev (named as IB counter files are), labels `device`,
    /// `port` (the RDMA port's) and `netdev`.
    pub const ETHTOOL_PREFIX: &str = "railscope_ethtool_";
    /// The prefix of every GPU series name.
    pub const GPU_PREFIX: &str = "railscope_gpu_";

    /// What the metric `name` is, one line: its constant's doc comment here (kind, unit,
    /// labels, meaning), the `# HELP` text of its family on the collector's `/metrics`. An IB
    /// counter file this list does not know gets the description of its kind; any other name
    /// the agent does not send, none.
    pub fn help(name: &str) -> Option<std::borrow::Cow<'static, str>> {
        if let Some((_, doc)) = DESCRIBED.iter().find(|(n, _)| *n == name) {
            return Some(doc.trim().into());
        }
        if let Some(stat) = name.strip_prefix(ETHTOOL_PREFIX) {
            let stat = stat.strip_suffix("_total")?;
            return Some(
                format!("Counter: the ethtool statistic `{stat}` of a RoCE port's netdev.").into(),
            );
        }
        let file = name.strip_prefix(IB_PREFIX)?.strip_suffix("_total")?;
        Some(format!("Counter: the sysfs counter file `{file}` of an IB device or port.").into())
    }

    metrics! {
        fixed {
            // The agent itself.
            /// Gauge, always 1, label `version`: the agent's version.
            AGENT_INFO = "railscope_agent_info";
            /// Gauge, label `table`: entries in one of the agent's bounded tables.
            AGENT_ENTRIES = "railscope_agent_entries";
            /// Gauge, bytes: the agent's resident memory.
            AGENT_RSS_BYTES = "railscope_agent_rss_bytes";
            /// Counter, label `bound`: times one of the agent's bounds was hit.
            AGENT_BOUND_HITS_TOTAL = "railscope_agent_bound_hits_total";
            /// Gauge, seconds: the node's clock minus its collector's (positive: the node runs ahead), estimated from the acknowledgements' round trips; sent from the first exchange on.
            AGENT_CLOCK_OFFSET_SECONDS = "railscope_agent_clock_offset_seconds";
            /// Gauge, seconds: the bound of `railscope_agent_clock_offset_seconds`'s error (half the round trip of its exchange, and the clocks' drift meanwhile).
            AGENT_CLOCK_OFFSET_ERROR_SECONDS = "railscope_agent_clock_offset_error_seconds";

            // RDMA verbs, from the probes.
            /// Counter, labels `device`, `verb`, `result`, `cgroup` (and the job's): verb calls.
            RDMA_VERBS_TOTAL = "railscope_rdma_verbs_total";

            // The hardware path: read at start and when it changes (not every sweep), sent
            // with every flush like `railscope_agent_info`. `numa_node` is `-1` where the
            // kernel does not say; `switch` is the PCI address of the upstream port of the
            // PCIe switch a device hangs off (empty when it sits on a root port or has no PCI
            // parent), `root_port` the PCI address of its root port (see [`crate::pci`]).
            /// Gauge, always 1, labels `pci`, `numa_node`, `switch`, `root_port`, `model`, `vbios`, `serial`: where a GPU sits on the PCIe tree, and what it is.
            GPU_PCI_INFO = "railscope_gpu_pci_info";
            /// Gauge, always 1, labels `device`, `pci`, `numa_node`, `switch`, `root_port`, `fw_ver`, `board_id`, `hca_type`, `node_guid`: where an RDMA device sits on the PCIe tree, its firmware and board (`pci` and the places empty without a PCI parent, as rxe on a veth).
            RDMA_DEVICE_INFO = "railscope_rdma_device_info";
            /// Gauge, label `device`: the PCIe generation an RDMA device's link trained at (sysfs `current_link_speed`: 2.5 GT/s is 1, 64 GT/s is 6).
            RDMA_PCIE_LINK_GENERATION = "railscope_rdma_pcie_link_generation";
            /// Gauge, label `device`: the highest PCIe generation an RDMA device's link can train at (`max_link_speed`).
            RDMA_PCIE_LINK_MAX_GENERATION = "railscope_rdma_pcie_link_max_generation";
            /// Gauge, lanes, label `device`: the PCIe width an RDMA device's link trained at (`current_link_width`).
            RDMA_PCIE_LINK_WIDTH_LANES = "railscope_rdma_pcie_link_width_lanes";
            /// Gauge, lanes, label `device`: the widest an RDMA device's PCIe link can train at (`max_link_width`).
            RDMA_PCIE_LINK_MAX_WIDTH_LANES = "railscope_rdma_pcie_link_max_width_lanes";
            /// Gauge, always 1, labels `kernel`, `driver` (NVIDIA's; empty without NVML), `gpu_model`, `nic_model` (the RDMA devices' `hca_type`): the node's hardware class and software.
            NODE_HARDWARE_INFO = "railscope_node_hardware_info";
            /// Gauge: the GPUs NVML sees on the node.
            NODE_GPUS = "railscope_node_gpus";
            /// Gauge: the RDMA devices on the node.
            NODE_RDMA_DEVICES = "railscope_node_rdma_devices";
            /// Gauge: the node's RDMA ports whose state is ACTIVE.
            NODE_ACTIVE_PORTS = "railscope_node_active_ports";

            // GPUs, from NVML.
            /// Gauge, ratio 0-1: the time a kernel ran (NVML utilization).
            GPU_UTILIZATION_RATIO = "railscope_gpu_utilization_ratio";
            /// Gauge, ratio 0-1: the time device memory was read or written.
            GPU_MEMORY_UTILIZATION_RATIO = "railscope_gpu_memory_utilization_ratio";
            /// Gauge, bytes: device memory in all.
            GPU_MEMORY_TOTAL_BYTES = "railscope_gpu_memory_total_bytes";
            /// Gauge, bytes: device memory the driver reserves.
            GPU_MEMORY_RESERVED_BYTES = "railscope_gpu_memory_reserved_bytes";
            /// Gauge, bytes: device memory in use.
            GPU_MEMORY_USED_BYTES = "railscope_gpu_memory_used_bytes";
            /// Gauge, bytes: device memory free.
            GPU_MEMORY_FREE_BYTES = "railscope_gpu_memory_free_bytes";
            /// Gauge, hertz: the SM clock.
            GPU_SM_CLOCK_HERTZ = "railscope_gpu_sm_clock_hertz";
            /// Gauge, hertz: the memory clock.
            GPU_MEMORY_CLOCK_HERTZ = "railscope_gpu_memory_clock_hertz";
            /// Gauge, degrees Celsius: the GPU die.
            GPU_TEMPERATURE_CELSIUS = "railscope_gpu_temperature_celsius";
            /// Gauge, watts: power drawn.
            GPU_POWER_WATTS = "railscope_gpu_power_watts";
            /// Counter, millijoules: energy since the driver loaded.
            GPU_ENERGY_MILLIJOULES_TOTAL = "railscope_gpu_energy_millijoules_total";
            /// Gauge 0/1, label `reason`: a clock event (throttle) reason active.
            GPU_THROTTLE_ACTIVE = "railscope_gpu_throttle_active";
            /// Gauge, bytes per second: PCIe transmit.
            GPU_PCIE_TX_BYTES_PER_SECOND = "railscope_gpu_pcie_tx_bytes_per_second";
            /// Gauge, bytes per second: PCIe receive.
            GPU_PCIE_RX_BYTES_PER_SECOND = "railscope_gpu_pcie_rx_bytes_per_second";
            /// Counter: PCIe replays.
            GPU_PCIE_REPLAYS_TOTAL = "railscope_gpu_pcie_replays_total";
            /// Gauge: the PCIe generation the link trained at.
            GPU_PCIE_LINK_GENERATION = "railscope_gpu_pcie_link_generation";
            /// Gauge: the highest PCIe generation the link can train at.
            GPU_PCIE_LINK_MAX_GENERATION = "railscope_gpu_pcie_link_max_generation";
            /// Gauge, lanes: the PCIe width the link trained at.
            GPU_PCIE_LINK_WIDTH_LANES = "railscope_gpu_pcie_link_width_lanes";
            /// Gauge, lanes: the widest the PCIe link can train at.
            GPU_PCIE_LINK_MAX_WIDTH_LANES = "railscope_gpu_pcie_link_max_width_lanes";
            /// Counter, labels `type` (corrected, uncorrected) and `scope` (volatile, aggregate).
            GPU_ECC_ERRORS_TOTAL = "railscope_gpu_ecc_errors_total";
            /// Counter, label `type` (corrected, uncorrected): rows remapped.
            GPU_REMAPPED_ROWS_TOTAL = "railscope_gpu_remapped_rows_total";
            /// Counter, label `type` (crc_flit, crc_data, replay, recovery): NVLink errors.
            GPU_NVLINK_ERRORS_TOTAL = "railscope_gpu_nvlink_errors_total";
            /// Gauge 0/1: a row remap waits for a GPU reset.
            GPU_ROW_REMAP_PENDING = "railscope_gpu_row_remap_pending";
            /// Gauge 0/1: a row remap failed.
            GPU_ROW_REMAP_FAILED = "railscope_gpu_row_remap_failed";
            /// Counter, bytes: NVLink data sent, all links.
            GPU_NVLINK_TX_BYTES_TOTAL = "railscope_gpu_nvlink_tx_bytes_total";
            /// Counter, bytes: NVLink data received, all links.
            GPU_NVLINK_RX_BYTES_TOTAL = "railscope_gpu_nvlink_rx_bytes_total";
            /// Gauge, ratio 0-1 (GPM): SM activity.
            GPU_SM_UTIL_RATIO = "railscope_gpu_sm_util_ratio";
            /// Gauge, ratio 0-1 (GPM): SM occupancy.
            GPU_SM_OCCUPANCY_RATIO = "railscope_gpu_sm_occupancy_ratio";
            /// Gauge, ratio 0-1 (GPM): integer pipe activity.
            GPU_INTEGER_UTIL_RATIO = "railscope_gpu_integer_util_ratio";
            /// Gauge, ratio 0-1 (GPM): any tensor pipe activity.
            GPU_TENSOR_UTIL_RATIO = "railscope_gpu_tensor_util_ratio";
            /// Gauge, ratio 0-1 (GPM): DFMA tensor pipe activity.
            GPU_TENSOR_DFMA_UTIL_RATIO = "railscope_gpu_tensor_dfma_util_ratio";
            /// Gauge, ratio 0-1 (GPM): HMMA tensor pipe activity.
            GPU_TENSOR_HMMA_UTIL_RATIO = "railscope_gpu_tensor_hmma_util_ratio";
            /// Gauge, ratio 0-1 (GPM): IMMA tensor pipe activity.
            GPU_TENSOR_IMMA_UTIL_RATIO = "railscope_gpu_tensor_imma_util_ratio";
            /// Gauge, ratio 0-1 (GPM): FP64 pipe activity.
            GPU_FP64_UTIL_RATIO = "railscope_gpu_fp64_util_ratio";
            /// Gauge, ratio 0-1 (GPM): FP32 pipe activity.
            GPU_FP32_UTIL_RATIO = "railscope_gpu_fp32_util_ratio";
            /// Gauge, ratio 0-1 (GPM): FP16 pipe activity.
            GPU_FP16_UTIL_RATIO = "railscope_gpu_fp16_util_ratio";
            /// Gauge, ratio 0-1 (GPM): DRAM bandwidth used.
            GPU_DRAM_BW_UTIL_RATIO = "railscope_gpu_dram_bw_util_ratio";
            /// Gauge, bytes per second (GPM): PCIe transmit.
            GPU_GPM_PCIE_TX_BYTES_PER_SECOND = "railscope_gpu_gpm_pcie_tx_bytes_per_second";
            /// Gauge, bytes per second (GPM): PCIe receive.
            GPU_GPM_PCIE_RX_BYTES_PER_SECOND = "railscope_gpu_gpm_pcie_rx_bytes_per_second";
            /// Gauge, bytes per second (GPM): NVLink transmit, all links.
            GPU_GPM_NVLINK_TX_BYTES_PER_SECOND = "railscope_gpu_gpm_nvlink_tx_bytes_per_second";
            /// Gauge, bytes per second (GPM): NVLink receive, all links.
            GPU_GPM_NVLINK_RX_BYTES_PER_SECOND = "railscope_gpu_gpm_nvlink_rx_bytes_per_second";

            // InfiniBand and RoCE ports, from sysfs (besides the counters below).
            /// Counter, bytes: `counters/port_xmit_data` × 4 (the file counts 4-byte words).
            IB_PORT_XMIT_BYTES_TOTAL = "railscope_ib_port_xmit_bytes_total";
            /// Counter, bytes: `counters/port_rcv_data` × 4.
            IB_PORT_RCV_BYTES_TOTAL = "railscope_ib_port_rcv_bytes_total";
            /// Gauge, seconds: `hw_counters/lifespan`, how long the driver caches hw_counters.
            IB_HW_COUNTERS_LIFESPAN_SECONDS = "railscope_ib_hw_counters_lifespan_seconds";
            /// Gauge: `state` code, 1 DOWN, 2 INIT, 3 ARMED, 4 ACTIVE, 5 ACTIVE_DEFER.
            IB_PORT_STATE = "railscope_ib_port_state";
            /// Gauge: `phys_state` code, 5 LinkUp, 6 LinkErrorRecovery, ...
            IB_PORT_PHYS_STATE = "railscope_ib_port_phys_state";
            /// Gauge, Gb/s: the port's rate.
            IB_PORT_RATE_GBPS = "railscope_ib_port_rate_gbps";
            /// Gauge, lanes: the width the link trained at.
            IB_PORT_WIDTH_LANES = "railscope_ib_port_width_lanes";
            /// Gauge, always 1, label `link_layer` (`InfiniBand`, `Ethernet`).
            IB_PORT_LINK_LAYER_INFO = "railscope_ib_port_link_layer_info";
            /// Gauge, always 1, labels `device`, `port`, `netdev`, `switch`, `switch_port`:
            /// the switch port a RoCE port's netdev is cabled to, as lldpd's LLDP neighbour
            /// names it (the chassis name, the port id); the collector's fabric topology.
            IB_PORT_NEIGHBOR_INFO = "railscope_ib_port_neighbor_info";
            /// Gauge, labels `device`, `port`, `counter` (the `counters/` file): 1 while a PMA
            /// counter of a width below 64 bits stands at its maximum (4294967295 for the
            /// 32-bit ones), where it stops counting and its rate reads as zero; 0 from the
            /// read that finds it below again (reset). Sent only for counters found saturated.
            IB_COUNTER_SATURATED = "railscope_ib_counter_saturated";
        }
        ib_counters {
            // `counters/`: the IB PMA counters.
            IB_EXCESSIVE_BUFFER_OVERRUN_ERRORS_TOTAL = "excessive_buffer_overrun_errors";
            IB_LINK_DOWNED_TOTAL = "link_downed";
            IB_LINK_ERROR_RECOVERY_TOTAL = "link_error_recovery";
            IB_LOCAL_LINK_INTEGRITY_ERRORS_TOTAL = "local_link_integrity_errors";
            IB_MULTICAST_RCV_PACKETS_TOTAL = "multicast_rcv_packets";
            IB_MULTICAST_XMIT_PACKETS_TOTAL = "multicast_xmit_packets";
            IB_PORT_RCV_CONSTRAINT_ERRORS_TOTAL = "port_rcv_constraint_errors";
            IB_PORT_RCV_ERRORS_TOTAL = "port_rcv_errors";
            IB_PORT_RCV_PACKETS_TOTAL = "port_rcv_packets";
            IB_PORT_RCV_REMOTE_PHYSICAL_ERRORS_TOTAL = "port_rcv_remote_physical_errors";
            IB_PORT_RCV_SWITCH_RELAY_ERRORS_TOTAL = "port_rcv_switch_relay_errors";
            IB_PORT_XMIT_CONSTRAINT_ERRORS_TOTAL = "port_xmit_constraint_errors";
            IB_PORT_XMIT_DISCARDS_TOTAL = "port_xmit_discards";
            IB_PORT_XMIT_PACKETS_TOTAL = "port_xmit_packets";
            IB_PORT_XMIT_WAIT_TOTAL = "port_xmit_wait";
            IB_SYMBOL_ERROR_TOTAL = "symbol_error";
            IB_UNICAST_RCV_PACKETS_TOTAL = "unicast_rcv_packets";
            IB_UNICAST_XMIT_PACKETS_TOTAL = "unicast_xmit_packets";
            IB_VL15_DROPPED_TOTAL = "vl15_dropped";
            // mlx5 `hw_counters/` (port and device level).
            IB_DUPLICATE_REQUEST_TOTAL = "duplicate_request";
            IB_IMPLIED_NAK_SEQ_ERR_TOTAL = "implied_nak_seq_err";
            IB_LOCAL_ACK_TIMEOUT_ERR_TOTAL = "local_ack_timeout_err";
            IB_NP_CNP_SENT_TOTAL = "np_cnp_sent";
            IB_NP_ECN_MARKED_ROCE_PACKETS_TOTAL = "np_ecn_marked_roce_packets";
            IB_OUT_OF_BUFFER_TOTAL = "out_of_buffer";
            IB_OUT_OF_SEQUENCE_TOTAL = "out_of_sequence";
            IB_PACKET_SEQ_ERR_TOTAL = "packet_seq_err";
            IB_REQ_CQE_ERROR_TOTAL = "req_cqe_error";
            IB_REQ_CQE_FLUSH_ERROR_TOTAL = "req_cqe_flush_error";
            IB_REQ_REMOTE_ACCESS_ERRORS_TOTAL = "req_remote_access_errors";
            IB_REQ_REMOTE_INVALID_REQUEST_TOTAL = "req_remote_invalid_request";
            IB_REQ_RNR_RETRIES_EXCEEDED_TOTAL = "req_rnr_retries_exceeded";
            IB_REQ_TRANSPORT_RETRIES_EXCEEDED_TOTAL = "req_transport_retries_exceeded";
            IB_RESP_CQE_ERROR_TOTAL = "resp_cqe_error";
            IB_RESP_CQE_FLUSH_ERROR_TOTAL = "resp_cqe_flush_error";
            IB_RESP_LOCAL_LENGTH_ERROR_TOTAL = "resp_local_length_error";
            IB_RESP_REMOTE_ACCESS_ERRORS_TOTAL = "resp_remote_access_errors";
            IB_RNR_NAK_RETRY_ERR_TOTAL = "rnr_nak_retry_err";
            IB_ROCE_ADP_RETRANS_TOTAL = "roce_adp_retrans";
            IB_ROCE_ADP_RETRANS_TO_TOTAL = "roce_adp_retrans_to";
            IB_ROCE_SLOW_RESTART_TOTAL = "roce_slow_restart";
            IB_ROCE_SLOW_RESTART_CNPS_TOTAL = "roce_slow_restart_cnps";
            IB_ROCE_SLOW_RESTART_TRANS_TOTAL = "roce_slow_restart_trans";
            IB_RP_CNP_HANDLED_TOTAL = "rp_cnp_handled";
            IB_RP_CNP_IGNORED_TOTAL = "rp_cnp_ignored";
            IB_RX_ATOMIC_REQUESTS_TOTAL = "rx_atomic_requests";
            IB_RX_DCT_CONNECT_TOTAL = "rx_dct_connect";
            IB_RX_ICRC_ENCAPSULATED_TOTAL = "rx_icrc_encapsulated";
            IB_RX_READ_REQUESTS_TOTAL = "rx_read_requests";
            IB_RX_WRITE_REQUESTS_TOTAL = "rx_write_requests";
            // rxe (soft-RoCE) `hw_counters/`.
            IB_ACK_DEFERRED_TOTAL = "ack_deferred";
            IB_COMPLETER_RETRY_ERR_TOTAL = "completer_retry_err";
            IB_OUT_OF_SEQ_REQUEST_TOTAL = "out_of_seq_request";
            IB_RCVD_PKTS_TOTAL = "rcvd_pkts";
            IB_RCVD_RNR_ERR_TOTAL = "rcvd_rnr_err";
            IB_RCVD_SEQ_ERR_TOTAL = "rcvd_seq_err";
            IB_RDMA_RECVS_TOTAL = "rdma_recvs";
            IB_RDMA_SENDS_TOTAL = "rdma_sends";
            IB_RETRY_EXCEEDED_ERR_TOTAL = "retry_exceeded_err";
            IB_RETRY_RNR_EXCEEDED_ERR_TOTAL = "retry_rnr_exceeded_err";
            IB_SEND_ERR_TOTAL = "send_err";
            IB_SEND_RNR_ERR_TOTAL = "send_rnr_err";
            IB_SENT_PKTS_TOTAL = "sent_pkts";
        }
        ethtool_stats {
            // mlx5's per-priority PFC counters: pause frames received (rx: the switch paused
            // this port) and sent (tx: this port paused the switch), and for how long, in
            // microseconds (`*_pause_duration`).
            ETHTOOL_RX_PRIO0_PAUSE_TOTAL = "rx_prio0_pause";
            ETHTOOL_RX_PRIO0_PAUSE_DURATION_TOTAL = "rx_prio0_pause_duration";
            ETHTOOL_TX_PRIO0_PAUSE_TOTAL = "tx_prio0_pause";
            ETHTOOL_TX_PRIO0_PAUSE_DURATION_TOTAL = "tx_prio0_pause_duration";
            ETHTOOL_RX_PRIO1_PAUSE_TOTAL = "rx_prio1_pause";
            ETHTOOL_RX_PRIO1_PAUSE_DURATION_TOTAL = "rx_prio1_pause_duration";
            ETHTOOL_TX_PRIO1_PAUSE_TOTAL = "tx_prio1_pause";
            ETHTOOL_TX_PRIO1_PAUSE_DURATION_TOTAL = "tx_prio1_pause_duration";
            ETHTOOL_RX_PRIO2_PAUSE_TOTAL = "rx_prio2_pause";
            ETHTOOL_RX_PRIO2_PAUSE_DURATION_TOTAL = "rx_prio2_pause_duration";
            ETHTOOL_TX_PRIO2_PAUSE_TOTAL = "tx_prio2_pause";
            ETHTOOL_TX_PRIO2_PAUSE_DURATION_TOTAL = "tx_prio2_pause_duration";
            ETHTOOL_RX_PRIO3_PAUSE_TOTAL = "rx_prio3_pause";
            ETHTOOL_RX_PRIO3_PAUSE_DURATION_TOTAL = "rx_prio3_pause_duration";
            ETHTOOL_TX_PRIO3_PAUSE_TOTAL = "tx_prio3_pause";
            ETHTOOL_TX_PRIO3_PAUSE_DURATION_TOTAL = "tx_prio3_pause_duration";
            ETHTOOL_RX_PRIO4_PAUSE_TOTAL = "rx_prio4_pause";
            ETHTOOL_RX_PRIO4_PAUSE_DURATION_TOTAL = "rx_prio4_pause_duration";
            ETHTOOL_TX_PRIO4_PAUSE_TOTAL = "tx_prio4_pause";
            ETHTOOL_TX_PRIO4_PAUSE_DURATION_TOTAL = "tx_prio4_pause_duration";
            ETHTOOL_RX_PRIO5_PAUSE_TOTAL = "rx_prio5_pause";
            ETHTOOL_RX_PRIO5_PAUSE_DURATION_TOTAL = "rx_prio5_pause_duration";
            ETHTOOL_TX_PRIO5_PAUSE_TOTAL = "tx_prio5_pause";
            ETHTOOL_TX_PRIO5_PAUSE_DURATION_TOTAL = "tx_prio5_pause_duration";
            ETHTOOL_RX_PRIO6_PAUSE_TOTAL = "rx_prio6_pause";
            ETHTOOL_RX_PRIO6_PAUSE_DURATION_TOTAL = "rx_prio6_pause_duration";
            ETHTOOL_TX_PRIO6_PAUSE_TOTAL = "tx_prio6_pause";
            ETHTOOL_TX_PRIO6_PAUSE_DURATION_TOTAL = "tx_prio6_pause_duration";
            ETHTOOL_RX_PRIO7_PAUSE_TOTAL = "rx_prio7_pause";
            ETHTOOL_RX_PRIO7_PAUSE_DURATION_TOTAL = "rx_prio7_pause_duration";
            ETHTOOL_TX_PRIO7_PAUSE_TOTAL = "tx_prio7_pause";
            ETHTOOL_TX_PRIO7_PAUSE_DURATION_TOTAL = "tx_prio7_pause_duration";
            // mlx5's ECN: packets of a priority marked congestion-experienced.
            ETHTOOL_RX_PRIO0_MARKED_TOTAL = "rx_prio0_marked";
            ETHTOOL_RX_PRIO1_MARKED_TOTAL = "rx_prio1_marked";
            ETHTOOL_RX_PRIO2_MARKED_TOTAL = "rx_prio2_marked";
            ETHTOOL_RX_PRIO3_MARKED_TOTAL = "rx_prio3_marked";
            ETHTOOL_RX_PRIO4_MARKED_TOTAL = "rx_prio4_marked";
            ETHTOOL_RX_PRIO5_MARKED_TOTAL = "rx_prio5_marked";
            ETHTOOL_RX_PRIO6_MARKED_TOTAL = "rx_prio6_marked";
            ETHTOOL_RX_PRIO7_MARKED_TOTAL = "rx_prio7_marked";
            // mlx5's port-level link pause (802.3x) and drops.
            ETHTOOL_RX_PAUSE_CTRL_PHY_TOTAL = "rx_pause_ctrl_phy";
            ETHTOOL_TX_PAUSE_CTRL_PHY_TOTAL = "tx_pause_ctrl_phy";
            ETHTOOL_RX_DISCARDS_PHY_TOTAL = "rx_discards_phy";
            ETHTOOL_TX_DISCARDS_PHY_TOTAL = "tx_discards_phy";
            ETHTOOL_RX_OUT_OF_BUFFER_TOTAL = "rx_out_of_buffer";
        }
    }
}

/// The kinds of the events the agent sends ([`WireEvent::kind`](crate::WireEvent::kind)).
pub mod event_kind {
    /// An IB port or device event (`ib_dispatch_event`); labels `device`, `port`; `text` the
    /// event's name (`IB_EVENT_PORT_ERR`, ...).
    pub const IB_PORT: &str = "ib_port";
    /// An async event of a user QP; labels `device`, `qp`.
    pub const QP_ASYNC: &str = "qp_async";
    /// An async event of a user CQ; label `device`.
    pub const CQ_ASYNC: &str = "cq_async";
    /// A QP moved to ERR by `modify_qp`; labels `device`, `qp`.
    pub const QP_TO_ERR: &str = "qp_to_err";
    /// An IB event of an origin this agent does not know (a newer probe object).
    pub const UNKNOWN: &str = "unknown";
    /// A port going UP (`code` 1) or DOWN (`code` 0); labels `device`, `port`, `from`.
    pub const PORT_TRANSITION: &str = "port_transition";
    /// A GPU XID error; label `gpu`, `code` the XID.
    pub const XID: &str = "xid";
    /// A GPU fallen off the bus or no longer answering NVML; label `gpu`.
    pub const GPU_LOST: &str = "gpu_lost";

    /// Every event kind, as (constant name, kind): what the collector serves its page.
    pub const ALL: &[(&str, &str)] = &[
        ("IB_PORT", IB_PORT),
        ("QP_ASYNC", QP_ASYNC),
        ("CQ_ASYNC", CQ_ASYNC),
        ("QP_TO_ERR", QP_TO_ERR),
        ("UNKNOWN", UNKNOWN),
        ("PORT_TRANSITION", PORT_TRANSITION),
        ("XID", XID),
        ("GPU_LOST", GPU_LOST),
    ];
}

pub use metric::AGENT_METRICS;

/// Every event kind the agent can send.
pub const EVENT_KINDS: &[&str] = &[
    event_kind::IB_PORT,
    event_kind::QP_ASYNC,
    event_kind::CQ_ASYNC,
    event_kind::QP_TO_ERR,
    event_kind::UNKNOWN,
    event_kind::PORT_TRANSITION,
    event_kind::XID,
    event_kind::GPU_LOST,
];

/// Whether `name` is a metric the agent can send: one of [`AGENT_METRICS`].
pub fn is_agent_metric(name: &str) -> bool {
    AGENT_METRICS.contains(&name)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    #[test]
    fn each_name_is_listed_once_and_well_formed() {
        let unique: BTreeSet<&str> = AGENT_METRICS.iter().copied().collect();
        assert_eq!(unique.len(), AGENT_METRICS.len(), "a metric listed twice");
        assert_eq!(metric::ALL.len(), AGENT_METRICS.len());
        for (konst, name) in metric::ALL {
            assert!(AGENT_METRICS.contains(name), "{konst}");
            assert_eq!(
                konst.to_ascii_lowercase(),
                name.strip_prefix("railscope_").unwrap(),
                "a constant is named after its metric"
            );
            assert!(
                name.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'),
                "{name}"
            );
        }
        for file in metric::IB_COUNTER_FILES {
            let name = format!("{}{file}_total", metric::IB_PREFIX);
            assert!(is_agent_metric(&name), "{name}");
        }
        for name in AGENT_METRICS {
            let help = metric::help(name).unwrap_or_else(|| panic!("{name} has no description"));
            assert!(
                help.len() > 10 && !help.contains(['\\', '\n']) && help.ends_with('.'),
                "{name}: {help:?}"
            );
        }
        let unknown_file = metric::help("railscope_ib_roce_cc_future_event_total").unwrap();
        assert!(
            unknown_file.contains("`roce_cc_future_event`"),
            "{unknown_file}"
        );
        for stat in metric::ETHTOOL_STATS {
            let name = format!("{}{stat}_total", metric::ETHTOOL_PREFIX);
            assert!(is_agent_metric(&name), "{name}");
        }
        let unknown_stat = metric::help("railscope_ethtool_rx_prio3_future_total").unwrap();
        assert_eq!(
            unknown_stat,
            "Counter: the ethtool statistic `rx_prio3_future` of a RoCE port's netdev."
        );
        assert_eq!(metric::help("node_cpu_seconds_total"), None);
        let kinds: BTreeSet<&str> = EVENT_KINDS.iter().copied().collect();
        assert_eq!(kinds.len(), EVENT_KINDS.len());
        assert_eq!(
            kinds,
            event_kind::ALL
                .iter()
                .map(|(_, k)| *k)
                .collect::<BTreeSet<_>>()
        );
        for (konst, kind) in event_kind::ALL {
            assert_eq!(konst.to_ascii_lowercase(), *kind);
        }
    }
}
