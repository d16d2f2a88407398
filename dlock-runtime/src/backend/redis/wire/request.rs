//! One request: its bytes, packed when it is made, and where its replies go.

use redis::{RedisResult, Value};
use tokio::sync::oneshot;

/// Where the replies of one request go: it expects `count` replies and answers the last
/// `keep` of them.
pub(super) struct Slot {
    pub(super) count: usize,
    pub(super) keep: usize,
    pub(super) got: Got,
    pub(super) tx: oneshot::Sender<RedisResult<Got>>,
}

/// The replies a request answers: one (most requests: no vector), or several.
pub(super) enum Got {
    One(Option<Value>),
    Many(Vec<Value>),
}

impl Slot {
    pub(super) fn new(count: usize, keep: usize) -> (Self, oneshot::Receiver<RedisResult<Got>>) {
        let (tx, rx) = oneshot::channel();
        let keep = keep.clamp(1, count.max(1));
        let slot = Self {
            count: count.max(1),
            keep,
            got: if keep == 1 {
                Got::One(None)
            } else {
                Got::Many(Vec::with_capacity(keep))
            },
            tx,
        };
        (slot, rx)
    }

    /// Takes one reply; true when it was the last one expected.
    pub(super) fn take(&mut self, value: Value, seen: &mut usize) -> bool {
        *seen += 1;
        if *seen > self.count - self.keep {
            match &mut self.got {
                Got::One(one) => *one = Some(value),
                Got::Many(many) => many.push(value),
            }
        }
        *seen == self.count
    }
}

/// A request, packed into the connection's buffer (or the caller's) when it is made.
#[derive(Clone, Copy)]
pub(in crate::backend::redis) enum Packed<'a> {
    Cmd(&'a redis::Cmd),
    Pipeline(&'a redis::Pipeline),
}

impl Packed<'_> {
    pub(super) fn write(self, out: &mut Vec<u8>) {
        match self {
            Self::Cmd(cmd) => cmd.write_packed_command(out),
            Self::Pipeline(pipe) if pipe.is_transaction() => {
                out.extend_from_slice(&pipe.get_packed_pipeline());
            }
            Self::Pipeline(pipe) => {
                for cmd in pipe.cmd_iter() {
                    cmd.write_packed_command(out);
                }
            }
        }
    }

    pub(super) fn to_vec(self) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(128);
        self.write(&mut bytes);
        bytes
    }
}
