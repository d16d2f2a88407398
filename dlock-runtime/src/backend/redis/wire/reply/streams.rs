//! Replies read from a byte stream that arrives cut anywhere: [`ReadBuf`] yields the same
//! replies whatever the cuts and whatever its buffer's size (it never mis-frames), and bytes
//! that are no RESP yield an error or a wait for more, never a panic or a loop.

use proptest::prelude::*;
use redis::Value;

use super::ReadBuf;

/// A RESP2 or RESP3 reply, as the test writes it.
#[derive(Debug, Clone)]
enum Reply {
    Simple(String),
    Error(String),
    Int(i64),
    Bulk(Option<Vec<u8>>),
    Array(Option<Vec<Reply>>),
    Null,
    Double(&'static str),
    Boolean(bool),
    BlobError(String),
    Verbatim(String),
    BigNumber(String),
    Map(Vec<(Reply, Reply)>),
    Set(Vec<Reply>),
    Push(Vec<Reply>),
    Attribute(Vec<(Reply, Reply)>, Box<Reply>),
}

impl Reply {
    /// The reply on the wire, appended to `out`.
    fn write(&self, out: &mut Vec<u8>) {
        let mut line = |kind: char, text: &str| {
            out.extend_from_slice(format!("{kind}{text}\r\n").as_bytes());
        };
        match self {
            Self::Simple(text) => line('+', text),
            Self::Error(text) => line('-', &format!("ERR {text}")),
            Self::Int(n) => line(':', &n.to_string()),
            Self::Bulk(None) => line('$', "-1"),
            Self::Bulk(Some(data)) => {
                line('$', &data.len().to_string());
                out.extend_from_slice(data);
                out.extend_from_slice(b"\r\n");
            }
            Self::Array(None) => line('*', "-1"),
            Self::Array(Some(items)) => {
                line('*', &items.len().to_string());
                items.iter().for_each(|item| item.write(out));
            }
            Self::Null => line('_', ""),
            Self::Double(text) => line(',', text),
            Self::Boolean(b) => line('#', if *b { "t" } else { "f" }),
            Self::BlobError(text) => {
                let text = format!("ERR {text}");
                line('!', &text.len().to_string());
                out.extend_from_slice(text.as_bytes());
                out.extend_from_slice(b"\r\n");
            }
            Self::Verbatim(text) => {
                let text = format!("txt:{text}");
                line('=', &text.len().to_string());
                out.extend_from_slice(text.as_bytes());
                out.extend_from_slice(b"\r\n");
            }
            Self::BigNumber(digits) => line('(', digits),
            Self::Map(pairs) => {
                line('%', &pairs.len().to_string());
                Self::write_pairs(pairs, out);
            }
            Self::Set(items) => {
                line('~', &items.len().to_string());
                items.iter().for_each(|item| item.write(out));
            }
            Self::Push(items) => {
                line('>', &(items.len() + 1).to_string());
                out.extend_from_slice(b"$7\r\nmessage\r\n");
                items.iter().for_each(|item| item.write(out));
            }
            Self::Attribute(pairs, reply) => {
                line('|', &pairs.len().to_string());
                Self::write_pairs(pairs, out);
                reply.write(out);
            }
        }
    }

    fn write_pairs(pairs: &[(Reply, Reply)], out: &mut Vec<u8>) {
        for (key, value) in pairs {
            key.write(out);
            value.write(out);
        }
    }

    fn bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.write(&mut out);
        out
    }
}

/// Any reply, aggregates nested up to four deep.
fn reply() -> impl Strategy<Value = Reply> {
    // Printable text, with a `\r` inside now and then (a line ends at CRLF only).
    let text = "[ -~]{0,8}(\r[ -~]{1,3})?";
    let leaf = prop_oneof![
        text.prop_map(Reply::Simple),
        "[ -~]{0,8}".prop_map(Reply::Error),
        any::<i64>().prop_map(Reply::Int),
        prop::option::of(prop::collection::vec(any::<u8>(), 0..24)).prop_map(Reply::Bulk),
        Just(Reply::Array(None)),
        Just(Reply::Null),
        prop::sample::select(vec!["3.14", "-0.5", "10", "inf", "-inf", "1e10"])
            .prop_map(Reply::Double),
        any::<bool>().prop_map(Reply::Boolean),
        "[ -~\r\n]{0,12}".prop_map(Reply::BlobError),
        "[ -~\r\n]{0,12}".prop_map(Reply::Verbatim),
        "-?[1-9][0-9]{0,30}".prop_map(Reply::BigNumber),
    ];
    leaf.prop_recursive(4, 48, 4, |inner| {
        let items = prop::collection::vec(inner.clone(), 0..4);
        let pairs = prop::collection::vec((inner.clone(), inner.clone()), 0..3);
        prop_oneof![
            items.clone().prop_map(|i| Reply::Array(Some(i))),
            pairs.clone().prop_map(Reply::Map),
            items.clone().prop_map(Reply::Set),
            items.prop_map(Reply::Push),
            (pairs, inner).prop_map(|(p, r)| Reply::Attribute(p, Box::new(r))),
        ]
    })
}

/// What reading `stream` gave: the replies, in order, and whether it stopped at an error
/// (else it waits for more bytes).
#[derive(Debug, PartialEq)]
struct Read {
    replies: Vec<String>,
    failed: bool,
}

/// Feeds `stream` to a [`ReadBuf`] of `size` bytes in pieces of the `cuts` sizes, over and
/// over, as the socket would hand them over: one read at most fills the buffer's free space,
/// and after each read every complete reply is taken.
fn read(stream: &[u8], cuts: &[usize], size: usize) -> Read {
    let mut buf = ReadBuf::new(size);
    let mut replies = Vec::new();
    let mut rest = stream;
    let mut cuts = cuts.iter().copied().cycle();
    // Each round moves at least one byte in; each reply taken moves at least one out.
    let mut rounds = 0;
    while !rest.is_empty() {
        let spare = buf.spare();
        let n = cuts
            .next()
            .unwrap_or(rest.len())
            .clamp(1, spare.len().min(rest.len()));
        spare[..n].copy_from_slice(&rest[..n]);
        buf.end += n;
        rest = &rest[n..];
        loop {
            rounds += 1;
            assert!(rounds <= 2 * stream.len() + 1, "no progress on {stream:?}");
            match buf.next_reply() {
                Ok(Some(value)) => replies.push(format!("{value:?}")),
                Ok(None) => break,
                Err(_) => {
                    return Read {
                        replies,
                        failed: true,
                    };
                }
            }
        }
    }
    Read {
        replies,
        failed: false,
    }
}

/// The client library's reading of each reply alone.
fn expected(replies: &[Reply]) -> Vec<String> {
    replies
        .iter()
        .map(|reply| {
            let value: Value = redis::parse_redis_value(&reply.bytes())
                .unwrap_or_else(|e| panic!("the client library refuses {reply:?}: {e}"));
            format!("{value:?}")
        })
        .collect()
}

fn cuts() -> impl Strategy<Value = Vec<usize>> {
    prop_oneof![
        Just(vec![1]),
        prop::collection::vec(1usize..48, 1..16),
        Just(vec![usize::MAX]),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn valid_streams_give_the_same_replies_whatever_the_cuts(
        replies in prop::collection::vec(reply(), 1..6),
        cuts in cuts(),
        size in 1usize..64,
    ) {
        let stream: Vec<u8> = replies.iter().flat_map(Reply::bytes).collect();
        let read = read(&stream, &cuts, size);
        prop_assert_eq!(read, Read { replies: expected(&replies), failed: false });
    }

    #[test]
    fn garbage_gives_an_error_or_a_wait_and_the_same_whatever_the_cuts(
        garbage in prop_oneof![
            prop::collection::vec(any::<u8>(), 0..96),
            // Mostly RESP: bytes of the RESP alphabet, which reach deeper into the framer.
            prop::collection::vec(
                prop::sample::select(b"+-:$*_,#!=(%~>|\r\n0123456789-1ab".to_vec()),
                0..96,
            ),
        ],
        cuts in cuts(),
        size in 1usize..64,
    ) {
        let whole = read(&garbage, &[usize::MAX], 4096);
        prop_assert_eq!(read(&garbage, &cuts, size), whole);
    }

    #[test]
    fn damaged_streams_give_an_error_or_a_wait_and_the_same_whatever_the_cuts(
        replies in prop::collection::vec(reply(), 1..4),
        damage in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>(), 0u8..3), 1..4),
        cuts in cuts(),
        size in 1usize..64,
    ) {
        let mut stream: Vec<u8> = replies.iter().flat_map(Reply::bytes).collect();
        for (at, byte, how) in damage {
            let at = at.index(stream.len() + 1);
            match how {
                0 => stream.insert(at, byte),
                1 if at < stream.len() => { stream.remove(at); }
                _ if at < stream.len() => stream[at] = byte,
                _ => stream.push(byte),
            }
        }
        let whole = read(&stream, &[usize::MAX], 4096);
        prop_assert_eq!(read(&stream, &cuts, size), whole);
    }
}
