//! Schema requests: the one message a collector sends back to an agent
//! (docs/wire-format.md, "Schema requests").

use crate::{
    codec::read_header,
    error::WireError,
    frame::VERSION,
    key::Key,
    mac::{self, MAC_LEN},
    prim::Reader,
};

/// Magic of a schema request, one of the messages a collector sends back to an agent
/// (with acknowledgements).
pub(crate) const REQUEST_MAGIC: [u8; 4] = *b"RSWQ";
/// The smallest schema request: magic, version, an empty node name, session, MAC.
pub(crate) const MIN_REQUEST_LEN: usize = 4 + 1 + 1 + 4 + MAC_LEN;

/// A collector's request to one agent session: "send every schema entry again". A collector
/// that restarted receives samples of ids it has no entry for; it asks, and the agent sends
/// the entries with its next flush, so schema refreshes can be rare (see
/// docs/wire-format.md, "Schema requests").
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SchemaRequest {
    pub node: String,
    pub session: u32,
}

/// Encodes a schema request, authenticated like a frame.
pub fn encode_schema_request(request: &SchemaRequest, key: &Key) -> Result<Vec<u8>, WireError> {
    let mut out = reply_head(REQUEST_MAGIC, &request.node, request.session)?;
    mac::seal(&mut out, key);
    Ok(out)
}

/// The head both messages to an agent start with: magic, version, node, session.
pub(crate) fn reply_head(magic: [u8; 4], node: &str, session: u32) -> Result<Vec<u8>, WireError> {
    let Ok(node_len) = u8::try_from(node.len()) else {
        return Err(WireError::NodeName {
            node: node.to_owned(),
            len: node.len(),
        });
    };
    let mut out = Vec::with_capacity(32 + node.len());
    out.extend_from_slice(&magic);
    out.push(VERSION);
    out.push(node_len);
    out.extend_from_slice(node.as_bytes());
    out.extend_from_slice(&session.to_le_bytes());
    Ok(out)
}

/// Reads [`reply_head`]: the node and the session.
pub(crate) fn read_reply_head(
    r: &mut Reader<'_>,
    magic: [u8; 4],
) -> Result<(String, u32), WireError> {
    read_header(r, magic)?;
    let node_len = usize::from(r.u8("node name length")?);
    let offset = r.offset();
    let node = std::str::from_utf8(r.bytes(node_len, "node name")?)
        .map_err(|_| WireError::Malformed {
            what: "node name",
            offset,
        })?
        .to_owned();
    let session = u32::from_le_bytes(
        r.bytes(4, "session")?
            .try_into()
            .expect("4 bytes were read"),
    );
    Ok((node, session))
}

/// Decodes a schema request: the MAC first, then the fields, all of them exactly.
pub fn decode_schema_request(bytes: &[u8], key: &Key) -> Result<SchemaRequest, WireError> {
    let body = mac::verify(bytes, key, MIN_REQUEST_LEN)?;
    let mut r = Reader::new(body, 0);
    let (node, session) = read_reply_head(&mut r, REQUEST_MAGIC)?;
    r.finish("schema request")?;
    Ok(SchemaRequest { node, session })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        codec::{decode, encode_frame},
        frame::Frame,
        receiver::ReceiverState,
        testing::key,
    };

    #[test]
    fn schema_requests_round_trip_and_refuse_anything_else() {
        let request = SchemaRequest {
            node: "gpu-node-017".into(),
            session: 0xdead_beef,
        };
        let bytes = encode_schema_request(&request, &key()).unwrap();
        assert_eq!(bytes.len(), MIN_REQUEST_LEN + request.node.len());
        assert_eq!(decode_schema_request(&bytes, &key()), Ok(request.clone()));

        let other_key = Key::from_bytes([7; 32]);
        assert!(matches!(
            decode_schema_request(&bytes, &other_key),
            Err(WireError::BadMac { .. })
        ));
        // Every truncation and every single bit flip is refused, never a panic.
        for len in 0..bytes.len() {
            assert!(
                decode_schema_request(&bytes[..len], &key()).is_err(),
                "{len}"
            );
        }
        for bit in 0..bytes.len() * 8 {
            let mut flipped = bytes.clone();
            flipped[bit / 8] ^= 1 << (bit % 8);
            assert!(
                decode_schema_request(&flipped, &key()).is_err(),
                "bit {bit}"
            );
        }
        // A frame is not a request, and a request is not a frame.
        let frame = encode_frame(
            &Frame {
                node: "n".into(),
                session: 1,
                seq: 0,
                send_unix_ns: 1,
                time_quantum_ns: 1,
                schema: Vec::new(),
                samples: Vec::new(),
                events: Vec::new(),
            },
            &key(),
        )
        .unwrap();
        assert_eq!(
            decode_schema_request(&frame, &key()),
            Err(WireError::BadMagic)
        );
        assert!(decode(&bytes, &key(), &mut ReceiverState::default()).is_err());
    }
}
