//! The two pieces of RFC 6455 that kumo's streaming endpoints share (the API server's
//! proxy and stream tunnel, the kubelet's exec and port-forward, the simulated sample API
//! server's watch): the handshake's accept key and an unmasked server frame.

use base64::Engine;

/// The GUID RFC 6455 appends to the client's key.
const GUID: &str = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

/// `Sec-WebSocket-Accept` for the client's `Sec-WebSocket-Key`.
pub fn accept_key(key: &str) -> String {
    let d = ring::digest::digest(
        &ring::digest::SHA1_FOR_LEGACY_USE_ONLY,
        format!("{key}{GUID}").as_bytes(),
    );
    base64::engine::general_purpose::STANDARD.encode(d.as_ref())
}

/// An unmasked (server-to-client) frame with FIN set.
pub fn frame(opcode: u8, payload: &[u8]) -> Vec<u8> {
    let mut f = vec![0x80 | opcode];
    let n = payload.len();
    if n < 126 {
        f.push(n as u8);
    } else if n <= 0xffff {
        f.push(126);
        f.extend_from_slice(&(n as u16).to_be_bytes());
    } else {
        f.push(127);
        f.extend_from_slice(&(n as u64).to_be_bytes());
    }
    f.extend_from_slice(payload);
    f
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc_6455_example() {
        // RFC 6455 section 1.3's example handshake.
        assert_eq!(
            accept_key("dGhlIHNhbXBsZSBub25jZQ=="),
            "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
        );
        assert_eq!(
            frame(0x1, b"Hello"),
            [0x81, 0x05, b'H', b'e', b'l', b'l', b'o']
        );
        assert_eq!(frame(0x2, &[0; 300])[..4], [0x82, 126, 0x01, 0x2c]);
    }
}
