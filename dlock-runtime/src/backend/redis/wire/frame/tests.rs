use super::*;

/// One complete reply of every type (and of the edge cases of each).
const SAMPLES: &[&[u8]] = &[
    b"+OK\r\n",
    b"+\r\n",
    b"+a\rb\r\n",
    b"-ERR unknown command 'foo'\r\n",
    b":0\r\n",
    b":-42\r\n",
    b"$5\r\nhello\r\n",
    b"$0\r\n\r\n",
    b"$-1\r\n",
    b"$12\r\nline\r\nbreak\n\r\n",
    b"$3\r\n$-1\r\n",
    b"*-1\r\n",
    b"*0\r\n",
    b"*2\r\n$3\r\nfoo\r\n:1\r\n",
    b"*3\r\n$-1\r\n*-1\r\n_\r\n",
    b"_\r\n",
    b",3.14\r\n",
    b",-inf\r\n",
    b",10\r\n",
    b"#t\r\n",
    b"#f\r\n",
    b"!21\r\nSYNTAX invalid syntax\r\n",
    b"!0\r\n\r\n",
    b"=15\r\ntxt:Some string\r\n",
    b"=8\r\nmkd:a\r\nb\r\n",
    b"(3492890328409238509324850943850943825024385\r\n",
    b"(-3\r\n",
    b"%2\r\n+first\r\n:1\r\n+second\r\n:2\r\n",
    b"%0\r\n",
    b"~3\r\n+a\r\n+b\r\n+c\r\n",
    b"~0\r\n",
    b">3\r\n$7\r\nmessage\r\n$7\r\nchannel\r\n$5\r\nhello\r\n",
    b">2\r\n+invalidate\r\n*1\r\n$3\r\nkey\r\n",
    b"|1\r\n+key-popularity\r\n%2\r\n$1\r\na\r\n,0.1923\r\n$1\r\nb\r\n,0.0012\r\n\
      *2\r\n:2039123\r\n:9543892\r\n",
    b"|0\r\n+OK\r\n",
    b"|1\r\n+ttl\r\n:3\r\n|1\r\n+a\r\n+b\r\n$2\r\nhi\r\n",
    b"*2\r\n|1\r\n+a\r\n+b\r\n:1\r\n:2\r\n",
    b"*3\r\n*2\r\n:1\r\n*1\r\n%1\r\n+k\r\n*2\r\n~1\r\n#t\r\n*0\r\n*-1\r\n$1\r\nx\r\n",
    b"%2\r\n*2\r\n:1\r\n:2\r\n%1\r\n+a\r\n_\r\n+b\r\n~2\r\n,1.5\r\n(7\r\n",
];

/// The lengths of the replies `buf` holds back to back, checking every prefix of each.
fn frames(buf: &[u8]) -> Vec<usize> {
    let mut lens = Vec::new();
    let mut rest = buf;
    while !rest.is_empty() {
        let len = reply_len(rest).unwrap().expect("a complete reply");
        for short in 0..len {
            assert_eq!(reply_len(&rest[..short]), Ok(None), "{:?}", &rest[..short]);
        }
        lens.push(len);
        rest = &rest[len..];
    }
    lens
}

#[test]
fn every_type_is_one_complete_reply() {
    for &sample in SAMPLES {
        assert_eq!(reply_len(sample), Ok(Some(sample.len())), "{sample:?}");
    }
}

#[test]
fn every_prefix_is_incomplete() {
    assert_eq!(reply_len(b""), Ok(None));
    for &sample in SAMPLES {
        for short in 0..sample.len() {
            assert_eq!(
                reply_len(&sample[..short]),
                Ok(None),
                "{:?}",
                &sample[..short]
            );
        }
    }
    // Prefixes of a buffer of several replies: none until the first one is whole, then
    // always the first one.
    let all = SAMPLES.concat();
    let first = SAMPLES[0].len();
    for end in 0..=all.len() {
        let expected = (end >= first).then_some(first);
        assert_eq!(reply_len(&all[..end]), Ok(expected), "{end}");
    }
    let lens: Vec<usize> = SAMPLES.iter().map(|s| s.len()).collect();
    assert_eq!(frames(&all), lens);
}

#[test]
fn back_to_back_replies_give_the_first() {
    for &a in SAMPLES {
        for &b in SAMPLES {
            let both = [a, b].concat();
            assert_eq!(reply_len(&both), Ok(Some(a.len())), "{both:?}");
        }
    }
    assert_eq!(reply_len(b"+OK\r\n+OK\r\n"), Ok(Some(5)));
    assert_eq!(reply_len(b"$-1\r\n:1\r\n"), Ok(Some(5)));
    // Whatever follows the first reply is not looked at.
    assert_eq!(reply_len(b":1\r\n?garbage"), Ok(Some(4)));
}

#[test]
fn nested_aggregates() {
    let nested = b"*2\r\n*2\r\n%1\r\n+k\r\n~2\r\n:1\r\n:2\r\n$1\r\nx\r\n>1\r\n+m\r\n";
    assert_eq!(reply_len(nested), Ok(Some(nested.len())));
    // An empty aggregate is complete at once, its parent still waits.
    assert_eq!(reply_len(b"*2\r\n*0\r\n"), Ok(None));
    assert_eq!(reply_len(b"*2\r\n*0\r\n%0\r\n"), Ok(Some(12)));
    // A map counts pairs: one pair is two replies.
    assert_eq!(reply_len(b"%1\r\n+k\r\n"), Ok(None));
    assert_eq!(reply_len(b"%1\r\n+k\r\n+v\r\n"), Ok(Some(12)));

    let deep = |n: usize| [b"*1\r\n".repeat(n), b":1\r\n".to_vec()].concat();
    assert_eq!(reply_len(&deep(MAX_DEPTH)), Ok(Some(4 * MAX_DEPTH + 4)));
    assert_eq!(reply_len(&deep(MAX_DEPTH + 1)), Err(TOO_DEEP));
    assert_eq!(reply_len(&b"*1\r\n".repeat(MAX_DEPTH)), Ok(None));
    assert_eq!(reply_len(&b"*1\r\n".repeat(MAX_DEPTH + 1)), Err(TOO_DEEP));
    let deep_empty = [b"*1\r\n".repeat(MAX_DEPTH), b"*0\r\n".to_vec()].concat();
    assert_eq!(reply_len(&deep_empty), Err(TOO_DEEP));
    // Nulls nest nothing.
    let deep_null = [b"*1\r\n".repeat(MAX_DEPTH), b"*-1\r\n".to_vec()].concat();
    assert_eq!(reply_len(&deep_null), Ok(Some(deep_null.len())));
    // Long but flat is fine.
    let wide = [b"*1000\r\n".to_vec(), b"*1\r\n:1\r\n".repeat(1000)].concat();
    assert_eq!(reply_len(&wide), Ok(Some(wide.len())));
}

#[test]
fn null_bulk_and_null_array() {
    assert_eq!(reply_len(b"$-1\r\n"), Ok(Some(5)));
    assert_eq!(reply_len(b"*-1\r\n"), Ok(Some(5)));
    assert_eq!(reply_len(b"*2\r\n$-1\r\n*-1\r\n"), Ok(Some(14)));
    // A null has no payload: what follows is the next reply.
    assert_eq!(reply_len(b"$-1\r\nabc\r\n"), Ok(Some(5)));
    for short in [&b"$-"[..], b"$-1", b"$-1\r", b"*-", b"*-1\r"] {
        assert_eq!(reply_len(short), Ok(None), "{short:?}");
    }
}

#[test]
fn attribute_is_framed_with_its_reply() {
    let attribute = b"|1\r\n+key-popularity\r\n%1\r\n$1\r\na\r\n,0.19\r\n";
    // The attribute alone is not a reply.
    assert_eq!(reply_len(attribute), Ok(None));
    let reply = [&attribute[..], b"$3\r\nfoo\r\n"].concat();
    assert_eq!(reply_len(&reply), Ok(Some(reply.len())));
    assert_eq!(reply_len(&reply[..reply.len() - 1]), Ok(None));
    let two = [&reply[..], b"+OK\r\n"].concat();
    assert_eq!(reply_len(&two), Ok(Some(reply.len())));
    // An attribute in an aggregate, with its reply, is one member.
    let inside = b"*2\r\n|1\r\n+a\r\n+b\r\n:1\r\n:2\r\n";
    assert_eq!(reply_len(inside), Ok(Some(inside.len())));
    assert_eq!(reply_len(&inside[..inside.len() - 4]), Ok(None));
    // An attribute's reply may itself be an aggregate.
    let aggregate = b"|0\r\n*2\r\n:1\r\n:2\r\n";
    assert_eq!(reply_len(aggregate), Ok(Some(aggregate.len())));
}

#[test]
fn malformed_inputs() {
    let cases: &[(&[u8], Malformed)] = &[
        (b"?", UNKNOWN_TYPE),
        (b"OK\r\n", UNKNOWN_TYPE),
        (b"\r\n", UNKNOWN_TYPE),
        (b"*2\r\n:1\r\n@x\r\n", UNKNOWN_TYPE),
        (b"|1\r\n+a\r\n+b\r\nhello\r\n", UNKNOWN_TYPE),
        (b"$x\r\n", NOT_A_LENGTH),
        (b"$x", NOT_A_LENGTH),
        (b"$\r\n", NOT_A_LENGTH),
        (b"$ 3\r\n", NOT_A_LENGTH),
        (b"$+3\r\n", NOT_A_LENGTH),
        (b"$3 \r\n", NOT_A_LENGTH),
        (b"$3.0\r\n", NOT_A_LENGTH),
        (b"*1x", NOT_A_LENGTH),
        (b"*-2\r\n", NOT_A_LENGTH),
        (b"$-0\r\n", NOT_A_LENGTH),
        (b"$-10", NOT_A_LENGTH),
        (b"$--1\r\n", NOT_A_LENGTH),
        (b"$-\r\n", NOT_A_LENGTH),
        (b"%\r\n", NOT_A_LENGTH),
        (b"$99999999999999999999999\r\n", TOO_LARGE),
        (b"$18446744073709551615\r\n", TOO_LARGE),
        (b"%9223372036854775808\r\n", TOO_LARGE),
        (b"%-1\r\n", NO_NULL),
        (b"~-1\r\n", NO_NULL),
        (b">-1\r\n", NO_NULL),
        (b"|-1\r\n", NO_NULL),
        (b"!-1\r\n", NO_NULL),
        (b"=-1\r\n", NO_NULL),
        (b"+OK\n", NO_CRLF),
        (b"+\n", NO_CRLF),
        (b"-ERR\nx\r\n", NO_CRLF),
        (b":1\n", NO_CRLF),
        (b"$3\rx", NO_CRLF),
        (b"*1\r*", NO_CRLF),
        (b"$3\r\nfooXY", NO_CRLF_AFTER_PAYLOAD),
        (b"$3\r\nfooX", NO_CRLF_AFTER_PAYLOAD),
        (b"$3\r\nfoo\rX", NO_CRLF_AFTER_PAYLOAD),
        (b"$3\r\nfoo\n", NO_CRLF_AFTER_PAYLOAD),
        (b"$2\r\nfoo\r\n", NO_CRLF_AFTER_PAYLOAD),
        (b"!3\r\nab\r\n", NO_CRLF_AFTER_PAYLOAD),
        (b"=5\r\ntxt:ab\r\n", NO_CRLF_AFTER_PAYLOAD),
        (b"*2\r\n$1\r\nab\r\n", NO_CRLF_AFTER_PAYLOAD),
    ];
    for (buf, error) in cases {
        assert_eq!(reply_len(buf).as_ref(), Err(error), "{buf:?}");
    }
    assert_eq!(
        UNKNOWN_TYPE.to_string(),
        "malformed RESP reply: a byte that starts no RESP type"
    );
    let boxed: Box<dyn std::error::Error> = Box::new(NO_CRLF);
    assert!(boxed.to_string().contains("CRLF"));
}

/// A small deterministic generator (xorshift64*), enough to vary the replies.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> usize {
        usize::try_from(self.next() % n).unwrap()
    }

    fn bytes(&mut self, max: u64) -> Vec<u8> {
        const ALPHABET: &[u8] = b"ab:\r\n$*+-_ 0\x00\xff";
        (0..self.below(max + 1))
            .map(|_| ALPHABET[self.below(ALPHABET.len() as u64)])
            .collect()
    }

    fn word(&mut self) -> String {
        let len = self.below(6);
        (0..len)
            .map(|_| char::from(b'a' + self.below(26) as u8))
            .collect()
    }
}

/// Appends a random reply (of every type, aggregates up to `depth` deep) to `out`.
fn random_reply(rng: &mut Rng, depth: usize, out: &mut Vec<u8>) {
    let bulk = |out: &mut Vec<u8>, kind: u8, payload: &[u8]| {
        out.push(kind);
        out.extend_from_slice(format!("{}\r\n", payload.len()).as_bytes());
        out.extend_from_slice(payload);
        out.extend_from_slice(b"\r\n");
    };
    let line = |out: &mut Vec<u8>, kind: u8, text: &str| {
        out.push(kind);
        out.extend_from_slice(text.as_bytes());
        out.extend_from_slice(b"\r\n");
    };
    let choices = if depth == 0 { 13 } else { 19 };
    match rng.below(choices) {
        0 => line(out, b'+', &rng.word()),
        1 => line(out, b'-', &format!("ERR {}", rng.word())),
        2 => line(out, b':', &(rng.next() as i64).to_string()),
        3 => line(out, b'_', ""),
        4 => line(out, b',', &format!("{}", rng.next() as f64 / 7.0)),
        5 => line(out, b'#', if rng.below(2) == 0 { "t" } else { "f" }),
        6 => line(out, b'(', &format!("{}{}", rng.next(), rng.next())),
        7 => {
            let payload = rng.bytes(40);
            bulk(out, b'$', &payload);
        }
        8 => out.extend_from_slice(b"$-1\r\n"),
        9 => out.extend_from_slice(b"*-1\r\n"),
        10 => bulk(out, b'!', format!("ERR {}", rng.word()).as_bytes()),
        11 => bulk(
            out,
            b'=',
            format!("txt:{}\r\n{}", rng.word(), rng.word()).as_bytes(),
        ),
        12 => out.extend_from_slice(b"*0\r\n"),
        kind => {
            let (byte, per, extra) = match kind {
                13 | 14 => (b'*', 1, 0),
                15 => (b'~', 1, 0),
                16 => (b'%', 2, 0),
                17 => (b'|', 2, 1),
                _ => (b'>', 1, 0),
            };
            // A push starts with its kind.
            let count = rng.below(4) + usize::from(byte == b'>');
            line(out, byte, &count.to_string());
            let members = count * per + extra;
            for member in 0..members {
                if byte == b'>' && member == 0 {
                    line(out, b'+', "message");
                } else {
                    random_reply(rng, depth - 1, out);
                }
            }
        }
    }
}

/// The redis crate parses each of `buf`'s frames, as a whole and as the first reply of the
/// rest of `buf`, to the same value; it fails on a frame cut short.
fn check_against_redis(buf: &[u8]) {
    let mut rest = buf;
    while !rest.is_empty() {
        let len = reply_len(rest).unwrap().expect("a complete reply");
        let frame = &rest[..len];
        let value = redis::parse_redis_value(frame)
            .unwrap_or_else(|e| panic!("redis rejects {frame:?}: {e}"));
        assert_eq!(
            redis::parse_redis_value(rest).ok(),
            Some(value),
            "{frame:?}"
        );
        assert!(
            redis::parse_redis_value(&frame[..len - 1]).is_err(),
            "{frame:?}"
        );
        rest = &rest[len..];
    }
}

#[test]
fn frames_are_what_the_redis_crate_parses() {
    for &sample in SAMPLES {
        check_against_redis(sample);
    }
    check_against_redis(&SAMPLES.concat());
    let deep = [b"*1\r\n".repeat(MAX_DEPTH), b"$2\r\nok\r\n".to_vec()].concat();
    check_against_redis(&deep);
}

#[test]
fn random_replies_frame_and_parse() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for _ in 0..2000 {
        let mut buf = Vec::new();
        let mut lens = Vec::new();
        for _ in 0..3 {
            let before = buf.len();
            random_reply(&mut rng, 4, &mut buf);
            lens.push(buf.len() - before);
        }
        assert_eq!(frames(&buf), lens, "{buf:?}");
        check_against_redis(&buf);
    }
}
