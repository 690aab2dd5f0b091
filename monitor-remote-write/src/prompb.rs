//! The remote-write v1 messages (`prometheus.WriteRequest` and what it holds, from
//! Prometheus' `prompb/remote.proto` and `types.proto`), declared with prost's derive so no
//! protoc is needed, and the body of a v1 request: the message snappy-compressed in the
//! block format.

/// `prometheus.Label`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Label {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub value: String,
}

/// `prometheus.Sample`: a value at a time in milliseconds since the Unix epoch.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Sample {
    #[prost(double, tag = "1")]
    pub value: f64,
    #[prost(int64, tag = "2")]
    pub timestamp: i64,
}

/// `prometheus.TimeSeries`: labels sorted by name, `__name__` among them, and samples in
/// time order (exemplars and histograms, tags 3 and 4, are not used).
#[derive(Clone, PartialEq, prost::Message)]
pub struct TimeSeries {
    #[prost(message, repeated, tag = "1")]
    pub labels: Vec<Label>,
    #[prost(message, repeated, tag = "2")]
    pub samples: Vec<Sample>,
}

/// `prometheus.WriteRequest` (metadata, tag 3, is not sent).
#[derive(Clone, PartialEq, prost::Message)]
pub struct WriteRequest {
    #[prost(message, repeated, tag = "1")]
    pub timeseries: Vec<TimeSeries>,
}

/// The headers every v1 request carries.
pub const HEADERS: [(&str, &str); 3] = [
    ("Content-Encoding", "snappy"),
    ("Content-Type", "application/x-protobuf"),
    ("X-Prometheus-Remote-Write-Version", "0.1.0"),
];

/// A request's body: the protobuf message compressed with snappy's block format (not the
/// framed stream format: receivers reject that).
pub fn encode_body(request: &WriteRequest) -> Vec<u8> {
    let bytes = prost::Message::encode_to_vec(request);
    snap::raw::Encoder::new()
        .compress_vec(&bytes)
        .expect("snappy compresses any input below 4 GiB")
}

/// The inverse of [`encode_body`]: what a receiver does (tests and fake receivers use it).
pub fn decode_body(body: &[u8]) -> Result<WriteRequest, String> {
    let bytes = snap::raw::Decoder::new()
        .decompress_vec(body)
        .map_err(|e| format!("snappy: {e}"))?;
    <WriteRequest as prost::Message>::decode(bytes.as_slice()).map_err(|e| format!("protobuf: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_is_snappy_block_of_the_protobuf_wire_bytes() {
        let request = WriteRequest {
            timeseries: vec![TimeSeries {
                labels: vec![Label {
                    name: "__name__".into(),
                    value: "up".into(),
                }],
                samples: vec![Sample {
                    value: 1.0,
                    timestamp: 1000,
                }],
            }],
        };
        let body = encode_body(&request);
        let raw = snap::raw::Decoder::new().decompress_vec(&body).unwrap();
        // Hand-assembled protobuf: timeseries (field 1, len 30) = label (field 1, len 14:
        // name "__name__", value "up") + sample (field 2, len 12: double 1.0, int64 1000).
        let mut expected = vec![0x0a, 30, 0x0a, 14, 0x0a, 8];
        expected.extend_from_slice(b"__name__");
        expected.extend_from_slice(&[0x12, 2, b'u', b'p', 0x12, 12, 0x09]);
        expected.extend_from_slice(&1.0f64.to_le_bytes());
        expected.extend_from_slice(&[0x10, 0xe8, 0x07]);
        assert_eq!(raw, expected);
        assert_eq!(decode_body(&body).unwrap(), request);
    }

    #[test]
    fn garbage_body_is_an_error_not_a_panic() {
        assert!(decode_body(b"not snappy at all").is_err());
    }
}
