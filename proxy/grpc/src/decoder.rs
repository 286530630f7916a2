//! Whole gRPC messages out of a stream's HTTP/2 DATA chunks.
//!
//! A chunk boundary says nothing about message boundaries: a message may
//! span many chunks, a chunk may hold many messages, and a 5-byte prefix may
//! itself be split. [`MessageDecoder`] reassembles them and enforces the
//! limit from the prefix alone, so a peer announcing a huge message never
//! gets any of it buffered.

use std::collections::VecDeque;

use bytes::{Buf, Bytes, BytesMut};

use crate::{Code, Status};

/// Length of a gRPC message prefix: the compressed flag and a big-endian
/// `u32` length.
pub const PREFIX_LEN: usize = 5;

/// Initial buffer for a message that spans chunks: its announced length is
/// the peer's word, so the buffer grows with what actually arrives.
const INITIAL_BODY_CAPACITY: usize = 64 * 1024;

/// Why a stream's bytes are not a sequence of acceptable gRPC messages.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The prefix announces more than the limit; nothing of the message
    /// was buffered.
    #[error("a gRPC message of {size} bytes was announced, more than the limit of {limit} bytes")]
    TooLarge {
        /// The length the prefix announced.
        size: usize,
        /// The decoder's limit.
        limit: usize,
    },
    /// Compressed flag 1: no compression is negotiated, so none is accepted.
    #[error("a compressed gRPC message (flag 1) arrived; compression is not supported")]
    Compressed,
    /// A compressed flag other than 0 or 1.
    #[error("gRPC message prefix has compressed flag {flag}, expected 0 (or 1)")]
    BadFlag {
        /// The flag byte.
        flag: u8,
    },
    /// The stream ended inside a message (or its prefix).
    #[error("the stream ended inside a gRPC message: {have} of {want} bytes (prefix included)")]
    Truncated {
        /// Bytes received of it, prefix included.
        have: usize,
        /// Bytes it should have had, prefix included (5 while the prefix
        /// itself is incomplete).
        want: usize,
    },
}

impl FrameError {
    /// The gRPC code a server answers this with.
    pub fn code(&self) -> Code {
        match self {
            FrameError::TooLarge { .. } => Code::ResourceExhausted,
            FrameError::Compressed => Code::Unimplemented,
            FrameError::BadFlag { .. } | FrameError::Truncated { .. } => Code::InvalidArgument,
        }
    }

    /// A short fixed reason (metric label).
    pub fn reason(&self) -> &'static str {
        match self {
            FrameError::TooLarge { .. } => "too_large",
            FrameError::Compressed => "compressed",
            FrameError::BadFlag { .. } => "bad_flag",
            FrameError::Truncated { .. } => "truncated",
        }
    }
}

impl From<FrameError> for Status {
    fn from(e: FrameError) -> Status {
        Status::new(e.code(), e.reason(), e.to_string())
    }
}

/// Reassembles gRPC messages from DATA chunks.
///
/// [`push`](Self::push) each chunk as it arrives, then take the messages it
/// completed with [`next_message`](Self::next_message); at the end of the
/// stream, [`finish`](Self::finish) says whether a message was cut short.
/// At most one incomplete message is buffered, never more than the limit.
/// After an error the decoder refuses everything (the stream cannot be
/// resynchronised); messages completed before the bad prefix stay available.
#[derive(Debug)]
pub struct MessageDecoder {
    limit: usize,
    prefix: [u8; PREFIX_LEN],
    prefix_len: usize,
    /// The message being received: its announced length and its bytes so far.
    body: Option<(usize, BytesMut)>,
    ready: VecDeque<Bytes>,
    failed: Option<FrameError>,
}

impl MessageDecoder {
    /// A decoder refusing messages longer than `limit` bytes (the prefix
    /// not counted).
    pub fn new(limit: usize) -> Self {
        MessageDecoder {
            limit,
            prefix: [0; PREFIX_LEN],
            prefix_len: 0,
            body: None,
            ready: VecDeque::new(),
            failed: None,
        }
    }

    /// The limit.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Takes one DATA chunk. An error is final: this and every later call
    /// return it.
    pub fn push(&mut self, mut chunk: Bytes) -> Result<(), FrameError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        while chunk.has_remaining() {
            if let Some((len, buf)) = &mut self.body {
                let take = (*len - buf.len()).min(chunk.len());
                buf.extend_from_slice(&chunk[..take]);
                chunk.advance(take);
                if buf.len() == *len {
                    let done = std::mem::take(buf).freeze();
                    self.ready.push_back(done);
                    self.body = None;
                }
                continue;
            }
            let take = (PREFIX_LEN - self.prefix_len).min(chunk.len());
            self.prefix[self.prefix_len..self.prefix_len + take].copy_from_slice(&chunk[..take]);
            self.prefix_len += take;
            chunk.advance(take);
            if self.prefix_len < PREFIX_LEN {
                break;
            }
            self.prefix_len = 0;
            let len = self.check_prefix()?;
            if chunk.len() >= len {
                // The whole message is in this chunk: no copy.
                self.ready.push_back(chunk.split_to(len));
            } else {
                let mut buf = BytesMut::with_capacity(len.min(INITIAL_BODY_CAPACITY));
                buf.extend_from_slice(&chunk);
                chunk.advance(chunk.len());
                self.body = Some((len, buf));
            }
        }
        Ok(())
    }

    /// Checks the complete prefix in `self.prefix`; the announced length.
    fn check_prefix(&mut self) -> Result<usize, FrameError> {
        let [flag, a, b, c, d] = self.prefix;
        let len = u32::from_be_bytes([a, b, c, d]) as usize;
        let problem = match flag {
            0 if len <= self.limit => return Ok(len),
            0 => FrameError::TooLarge {
                size: len,
                limit: self.limit,
            },
            1 => FrameError::Compressed,
            flag => FrameError::BadFlag { flag },
        };
        self.failed = Some(problem.clone());
        Err(problem)
    }

    /// The next complete message, oldest first.
    pub fn next_message(&mut self) -> Option<Bytes> {
        self.ready.pop_front()
    }

    /// Bytes held of the incomplete message (prefix included).
    pub fn buffered(&self) -> usize {
        match &self.body {
            Some((_, buf)) => PREFIX_LEN + buf.len(),
            None => self.prefix_len,
        }
    }

    /// At the end of the stream: an error when it ended inside a message
    /// (or after an error). Complete messages not yet taken are not a
    /// problem.
    pub fn finish(&self) -> Result<(), FrameError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        match &self.body {
            Some((len, buf)) => Err(FrameError::Truncated {
                have: PREFIX_LEN + buf.len(),
                want: PREFIX_LEN + len,
            }),
            None if self.prefix_len > 0 => Err(FrameError::Truncated {
                have: self.prefix_len,
                want: PREFIX_LEN,
            }),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::encode_frame;

    fn drain(d: &mut MessageDecoder) -> Vec<Vec<u8>> {
        std::iter::from_fn(|| d.next_message())
            .map(|m| m.to_vec())
            .collect()
    }

    fn frames(messages: &[&[u8]]) -> Vec<u8> {
        messages.iter().flat_map(|m| encode_frame(m)).collect()
    }

    #[test]
    fn a_message_split_at_every_byte_is_reassembled() {
        let messages: [&[u8]; 4] = [b"first", b"", b"third message", &[0u8; 300]];
        let wire = frames(&messages);
        // Every split into two chunks, then one byte per chunk.
        for cut in 0..=wire.len() {
            let mut d = MessageDecoder::new(1024);
            d.push(Bytes::copy_from_slice(&wire[..cut])).unwrap();
            d.push(Bytes::copy_from_slice(&wire[cut..])).unwrap();
            assert_eq!(drain(&mut d), messages, "cut at {cut}");
            assert_eq!(d.buffered(), 0);
            d.finish().unwrap();
        }
        let mut d = MessageDecoder::new(1024);
        let mut got = Vec::new();
        for b in &wire {
            d.push(Bytes::copy_from_slice(&[*b])).unwrap();
            got.extend(drain(&mut d));
        }
        assert_eq!(got, messages);
        d.finish().unwrap();
    }

    #[test]
    fn many_messages_in_one_chunk_come_out_in_order() {
        let bodies: Vec<Vec<u8>> = (0..200u32)
            .map(|i| i.to_be_bytes().repeat((i % 7) as usize))
            .collect();
        let refs: Vec<&[u8]> = bodies.iter().map(Vec::as_slice).collect();
        let mut d = MessageDecoder::new(64);
        d.push(Bytes::from(frames(&refs))).unwrap();
        assert_eq!(drain(&mut d), bodies);
        d.finish().unwrap();
    }

    #[test]
    fn a_truncated_prefix_or_body_is_reported_at_the_end() {
        let mut d = MessageDecoder::new(1024);
        d.push(Bytes::from_static(&[0, 0, 0])).unwrap();
        assert_eq!(d.next_message(), None);
        assert_eq!(d.buffered(), 3);
        assert_eq!(d.finish(), Err(FrameError::Truncated { have: 3, want: 5 }));

        let mut d = MessageDecoder::new(1024);
        d.push(Bytes::from_static(&[0, 0, 0, 0, 10, 1, 2, 3]))
            .unwrap();
        assert_eq!(d.next_message(), None);
        assert_eq!(d.buffered(), 8);
        let e = d.finish().unwrap_err();
        assert_eq!(e, FrameError::Truncated { have: 8, want: 15 });
        assert!(e.to_string().contains("8 of 15 bytes"), "{e}");
    }

    #[test]
    fn an_oversized_message_is_refused_from_its_prefix_alone() {
        let mut d = MessageDecoder::new(1000);
        // Exactly the limit is fine.
        let mut at_limit = vec![0, 0, 0, 0x03, 0xe8];
        at_limit.extend([7u8; 1000]);
        d.push(Bytes::from(at_limit)).unwrap();
        assert_eq!(d.next_message().unwrap().len(), 1000);
        // One more byte is refused as soon as the prefix is complete, split
        // or not, with nothing buffered.
        d.push(Bytes::from_static(&[0, 0, 0])).unwrap();
        let e = d.push(Bytes::from_static(&[0x03, 0xe9])).unwrap_err();
        assert_eq!(
            e,
            FrameError::TooLarge {
                size: 1001,
                limit: 1000
            }
        );
        assert!(e.to_string().contains("1001 bytes"), "{e}");
        assert!(e.to_string().contains("limit of 1000"), "{e}");
        assert_eq!(d.buffered(), 0, "nothing of the message is held");
        // Final: later chunks are refused with the same error.
        assert_eq!(d.push(Bytes::from_static(&[1, 2, 3])), Err(e.clone()));
        assert_eq!(d.finish(), Err(e));

        let mut d = MessageDecoder::new(1 << 20);
        let e = d
            .push(Bytes::from_static(&[0, 0xff, 0xff, 0xff, 0xff]))
            .unwrap_err();
        assert_eq!(
            e,
            FrameError::TooLarge {
                size: u32::MAX as usize,
                limit: 1 << 20
            }
        );
        assert_eq!(Status::from(e).code, Code::ResourceExhausted);
    }

    #[test]
    fn compressed_and_unknown_flags_are_refused() {
        let mut d = MessageDecoder::new(1024);
        let e = d.push(Bytes::from_static(&[1, 0, 0, 0, 1, 9])).unwrap_err();
        assert_eq!(e, FrameError::Compressed);
        assert!(e.to_string().contains("not supported"), "{e}");
        assert_eq!(Status::from(e).code, Code::Unimplemented);
        for flag in [2u8, 0x80, 0xff] {
            let mut d = MessageDecoder::new(1024);
            let e = d
                .push(Bytes::copy_from_slice(&[flag, 0, 0, 0, 0]))
                .unwrap_err();
            assert_eq!(e, FrameError::BadFlag { flag });
            assert!(e.to_string().contains(&format!("flag {flag}")), "{e}");
            assert_eq!(Status::from(e).code, Code::InvalidArgument);
        }
    }

    #[test]
    fn messages_before_a_bad_prefix_stay_available() {
        let mut wire = frames(&[b"one", b"two"]);
        wire.extend([9, 0, 0, 0, 0]);
        let mut d = MessageDecoder::new(1024);
        assert_eq!(
            d.push(Bytes::from(wire)),
            Err(FrameError::BadFlag { flag: 9 })
        );
        assert_eq!(drain(&mut d), [b"one".to_vec(), b"two".to_vec()]);
    }

    #[test]
    fn empty_chunks_change_nothing() {
        let mut d = MessageDecoder::new(16);
        d.push(Bytes::new()).unwrap();
        d.push(Bytes::from_static(&[0, 0])).unwrap();
        d.push(Bytes::new()).unwrap();
        d.push(Bytes::from_static(&[0, 0, 1, b'x'])).unwrap();
        assert_eq!(drain(&mut d), [b"x".to_vec()]);
        d.finish().unwrap();
    }
}
