//! Reading replies: bytes from the socket, cut into replies by [`frame::reply_len`], and the
//! value of each.

use std::io;

use redis::{RedisError, RedisResult, Value};
use tokio::net::TcpStream;

use super::frame;

/// Bytes read from a connection: `buf[start..end]` not yet parsed.
pub(super) struct ReadBuf {
    buf: Vec<u8>,
    start: usize,
    end: usize,
}

impl ReadBuf {
    pub(super) fn new(size: usize) -> Self {
        Self {
            buf: vec![0; size],
            start: 0,
            end: 0,
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.start == self.end
    }

    /// Reads what the socket has (one `read`); an end of stream is an error.
    pub(super) fn fill(&mut self, stream: &TcpStream) -> io::Result<()> {
        match stream.try_read(self.spare())? {
            0 => Err(io::Error::new(
                io::ErrorKind::ConnectionReset,
                "the server closed the connection",
            )),
            n => {
                self.end += n;
                Ok(())
            }
        }
    }

    /// The free space after the unparsed bytes, never empty: made by moving them to the
    /// front, or by growing the buffer when they fill it (a reply larger than the buffer).
    fn spare(&mut self) -> &mut [u8] {
        if self.end == self.buf.len() {
            if self.start > 0 {
                self.buf.copy_within(self.start..self.end, 0);
                self.end -= self.start;
                self.start = 0;
            } else {
                self.buf.resize((self.buf.len() * 2).max(1), 0);
            }
        }
        &mut self.buf[self.end..]
    }

    /// The next complete reply, if the buffer holds one.
    pub(super) fn next_reply(&mut self) -> RedisResult<Option<Value>> {
        let rest = &self.buf[self.start..self.end];
        let Some(len) = frame::reply_len(rest).map_err(malformed)? else {
            return Ok(None);
        };
        let value = parse(&rest[..len])?;
        self.start += len;
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
        Ok(Some(value))
    }
}

/// The value of one complete reply (`frame`, framed by [`frame::reply_len`]): the shapes the
/// runtime's requests get (simple strings, integers, bulk strings, nulls, booleans, and
/// arrays of those) read directly, any other by the client library's parser (which builds a
/// decoder and copies the bytes for each value).
fn parse(frame: &[u8]) -> RedisResult<Value> {
    match simple(frame) {
        Some((value, used)) if used == frame.len() => Ok(value),
        _ => redis::parse_redis_value(frame),
    }
}

/// One value of a common shape at the start of `buf` and the bytes it took, or `None`. The
/// lines and lengths are read by the framer's own rules ([`frame::line_end`],
/// [`frame::length`]); a line with a `\r` inside is left to the client library.
fn simple(buf: &[u8]) -> Option<(Value, usize)> {
    let (&kind, _) = buf.split_first()?;
    match kind {
        b'$' => match frame::length(buf, 1).ok()?? {
            (None, after) => Some((Value::Nil, after)),
            (Some(len), after) => {
                let data = buf.get(after..after.checked_add(len)?)?;
                Some((Value::BulkString(data.to_vec()), after + len + 2))
            }
        },
        b'*' => match frame::length(buf, 1).ok()?? {
            (None, after) => Some((Value::Nil, after)),
            (Some(len), after) => {
                let mut items = Vec::with_capacity(len.min(1024));
                let mut at = after;
                for _ in 0..len {
                    let (item, used) = simple(buf.get(at..)?)?;
                    items.push(item);
                    at += used;
                }
                Some((Value::Array(items), at))
            }
        },
        _ => {
            let after = frame::line_end(buf, 1).ok()??;
            let line = buf.get(1..after - 2)?;
            if line.contains(&b'\r') {
                return None;
            }
            let value = match kind {
                b'+' if line == b"OK" => Value::Okay,
                b'+' => Value::SimpleString(std::str::from_utf8(line).ok()?.to_owned()),
                b':' => Value::Int(std::str::from_utf8(line).ok()?.parse().ok()?),
                b'_' => Value::Nil,
                b'#' => match line {
                    b"t" => Value::Boolean(true),
                    b"f" => Value::Boolean(false),
                    _ => return None,
                },
                _ => return None,
            };
            Some((value, after))
        }
    }
}

pub(super) fn protocol_error(what: &'static str) -> RedisError {
    RedisError::from((redis::ErrorKind::Parse, what))
}

fn malformed(e: frame::Malformed) -> RedisError {
    RedisError::from((redis::ErrorKind::Parse, "malformed reply", e.to_string()))
}

#[cfg(test)]
mod streams;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn common_replies_parse_as_the_client_library_parses_them() {
        let replies: &[&[u8]] = &[
            b"+OK\r\n",
            b"+QUEUED\r\n",
            b":-42\r\n",
            b"$5\r\nhe\r\no\r\n",
            b"$0\r\n\r\n",
            b"$-1\r\n",
            b"_\r\n",
            b"#t\r\n",
            b"#f\r\n",
            b"*-1\r\n",
            b"*0\r\n",
            b"*3\r\n:1\r\n$2\r\nab\r\n*2\r\n_\r\n+x\r\n",
            // Read by the client library's parser.
            b"-ERR no\r\n",
            b"%1\r\n+a\r\n:1\r\n",
            b"*2\r\n:1\r\n,1.5\r\n",
            b">2\r\n+message\r\n+x\r\n",
            b"+a\rb\r\n",
            b"*2\r\n+a\rb\r\n:1\r\n",
        ];
        for reply in replies {
            let ours = parse(reply).unwrap();
            let theirs = redis::parse_redis_value(reply).unwrap();
            assert_eq!(format!("{ours:?}"), format!("{theirs:?}"), "{reply:?}");
        }
        assert!(simple(b"-ERR no\r\n").is_none());
    }
}
