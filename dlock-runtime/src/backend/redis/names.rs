//! Key and channel names of one lock, every one in the same hash slot:
//! - lock `<prefix>{<key>}`: a string, the owner token (`+` appended once a waiter outside the
//!   holder's process asked to be notified); its TTL is the lease;
//! - fence counter `<prefix>{<key>}:fence`;
//! - release channel `<prefix>{<key>}:released`;
//! - a read-write lock's readers `<prefix>{<key>}:readers` (the lock string holds their mark);
//! - a semaphore's holders `<prefix>{<key>}:permits` and size `<prefix>{<key>}:permits:n`.
//! - for fair locks, the queue of waiters `<prefix>{<key>}:queue` and the deadlines of their
//!   places `<prefix>{<key>}:places`.
//!
//! The hash tag must be the key, whatever the key and the prefix: inside the braces a key's
//! `%` and `}` are written `%25` and `%7D`, and the prefix's `%`, `{` and `}` likewise (with
//! `%7B`), so the first `{` of every name is the tag's, the tag ends where the key does and is
//! never empty. Keys and prefixes without those characters keep their names as written.

use std::borrow::Cow;

/// What the fence counter's name adds to the lock's (see [`Names::fence`]).
pub(crate) const FENCE: &str = ":fence";

/// What the line of runtimes' name adds to the lock's (see [`Names::turns`]).
pub(crate) const TURNS: &str = ":turns";

/// Key and channel names for one prefix.
#[derive(Debug, Clone)]
pub(crate) struct Names {
    /// The prefix as written in names (braces and `%` escaped).
    prefix: String,
}

impl Names {
    pub(crate) fn new(prefix: &str) -> Self {
        Self {
            prefix: escape(prefix, &['%', '{', '}']).into_owned(),
        }
    }

    /// The prefix as every name starts with it (braces and `%` escaped): what an ACL's key and
    /// channel patterns must match (`~<prefix>*`, `&<prefix>*`).
    pub(super) fn written_prefix(&self) -> &str {
        &self.prefix
    }

    /// `<prefix>{<key>}`, the part every name of the key starts with.
    fn tagged(&self, key: &str) -> String {
        let key = self.tag(key);
        // Room for the longest suffix a name adds (`:permits:n`): one allocation a name.
        let mut name = String::with_capacity(self.prefix.len() + key.len() + 12);
        name.push_str(&self.prefix);
        name.push('{');
        name.push_str(&key);
        name.push('}');
        name
    }

    pub(crate) fn lock(&self, key: &str) -> String {
        self.tagged(key)
    }

    /// `key` as the hash tag of its names writes it (`%` and `}` escaped): borrowed when it
    /// has neither, the common case. Made once a request for all the names it sends, see
    /// [`Names::name`].
    pub(crate) fn tag<'a>(&self, key: &'a str) -> Cow<'a, str> {
        if !key.bytes().any(|b| b == b'%' || b == b'}') {
            // The common case, checked first with the two bytes spelled out (a scan for a
            // list of characters costs several times more on every request).
            return Cow::Borrowed(key);
        }
        escape(key, &['%', '}'])
    }

    /// The name `<prefix>{<tag>}<suffix>` (`suffix` empty for the lock itself, else
    /// [`FENCE`], [`TURNS`], …) as a command argument written in place: no `String` a name.
    /// `tag` comes from [`Names::tag`].
    pub(crate) fn name<'a>(&'a self, tag: &'a str, suffix: &'static str) -> Name<'a> {
        Name {
            prefix: &self.prefix,
            tag,
            suffix,
        }
    }

    pub(crate) fn fence(&self, key: &str) -> String {
        self.tagged(key) + FENCE
    }

    /// `<prefix>{<key>}:turns`: the runtimes waiting for the key in the order they came (see
    /// `lua/acquire.lua`).
    pub(crate) fn turns(&self, key: &str) -> String {
        self.tagged(key) + TURNS
    }

    /// `<prefix>{<key>}:readers`: a read-write lock's readers (see `lua/read_acquire.lua`).
    pub(crate) fn readers(&self, key: &str) -> String {
        self.tagged(key) + ":readers"
    }

    /// `<prefix>{<key>}:permits`: a semaphore's holders (see `lua/permit_acquire.lua`).
    pub(crate) fn permits(&self, key: &str) -> String {
        self.tagged(key) + ":permits"
    }

    /// `<prefix>{<key>}:permits:n`: a semaphore's size while it has holders.
    pub(crate) fn permits_size(&self, key: &str) -> String {
        self.tagged(key) + ":permits:n"
    }

    /// The waiters of a fair lock, first in line first (`lua/fair_acquire.lua`).
    pub(crate) fn fair_queue(&self, key: &str) -> String {
        self.tagged(key) + ":queue"
    }

    /// The deadline of each fair waiter's place in line (`lua/fair_acquire.lua`).
    pub(crate) fn fair_places(&self, key: &str) -> String {
        self.tagged(key) + ":places"
    }

    pub(crate) fn channel(&self, key: &str) -> String {
        self.tagged(key) + ":released"
    }

    /// The user key of a lock name (`<prefix>{<key>}`), if the name is one of ours and a
    /// lock's (not a fence counter's).
    pub(super) fn key_of_lock(&self, name: &str) -> Option<String> {
        let tag = name
            .strip_prefix(self.prefix.as_str())?
            .strip_prefix('{')?
            .strip_suffix('}')?;
        if tag.contains('}') {
            // A key's `}` is written `%7D`: this is not a name the engine made.
            return None;
        }
        unescape(tag)
    }

    /// The user key of a semaphore's permits name (`<prefix>{<key>}:permits`), if the name
    /// is one of ours.
    pub(super) fn key_of_permits(&self, name: &str) -> Option<String> {
        self.key_of_lock(name.strip_suffix(":permits")?)
    }

    /// The `SCAN … MATCH` pattern of every lock whose key starts with `key_prefix`:
    /// `<prefix>{<key_prefix>*`, with the glob characters of both written literally.
    pub(super) fn lock_pattern(&self, key_prefix: &str) -> String {
        let start = format!("{}{{{}", self.prefix, escape(key_prefix, &['%', '}']));
        let mut pattern = String::with_capacity(start.len() + 8);
        for c in start.chars() {
            if matches!(c, '*' | '?' | '[' | ']' | '\\') {
                pattern.push('\\');
            }
            pattern.push(c);
        }
        pattern.push('*');
        pattern
    }

    /// The user key of a release channel, if the channel is one of ours.
    pub(super) fn key_of_channel(&self, channel: &str) -> Option<String> {
        let tag = channel
            .strip_prefix(self.prefix.as_str())?
            .strip_prefix('{')?
            .strip_suffix("}:released")?;
        unescape(tag)
    }
}

/// A name of one key (see [`Names::name`]), written straight into a command's argument.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Name<'a> {
    prefix: &'a str,
    tag: &'a str,
    suffix: &'static str,
}

impl Name<'_> {
    /// Its length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.prefix.len() + self.tag.len() + 2 + self.suffix.len()
    }
}

impl std::fmt::Display for Name<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}{{{}}}{}", self.prefix, self.tag, self.suffix)
    }
}

impl redis::ToRedisArgs for Name<'_> {
    fn write_redis_args<W>(&self, out: &mut W)
    where
        W: ?Sized + redis::RedisWrite,
    {
        let parts = [self.prefix, "{", self.tag, "}", self.suffix];
        // Put together on the stack and written as one argument, as a `String` name would be
        // (a write a part costs more than the copy).
        let mut name = [0u8; 192];
        if let Some(name) = name.get_mut(..self.len()) {
            let mut at = 0;
            for part in parts {
                name[at..at + part.len()].copy_from_slice(part.as_bytes());
                at += part.len();
            }
            out.write_arg(name);
        } else {
            use std::io::Write;
            let mut arg = out.writer_for_next_arg();
            for part in parts {
                // Arguments are written into the command's memory buffer: this cannot fail.
                let _ = arg.write_all(part.as_bytes());
            }
        }
    }
}

/// `text` with each of `special` (and only those) written `%XX`; borrowed when there is none
/// (the common case: no allocation on the hot path).
fn escape<'a>(text: &'a str, special: &[char]) -> Cow<'a, str> {
    // Every special character is ASCII: a byte scan finds them (it runs for every name of
    // every request, mostly on keys that have none).
    debug_assert!(special.iter().all(char::is_ascii));
    if !text.bytes().any(|b| special.contains(&char::from(b))) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 4);
    for c in text.chars() {
        if special.contains(&c) {
            out.push_str(&format!("%{:02X}", u32::from(c)));
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// The inverse of [`escape`] for the characters it writes (`%25`, `%7B`, `%7D`).
fn unescape(text: &str) -> Option<String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('%') {
        out.push_str(&rest[..at]);
        let code = rest.get(at + 1..at + 3)?;
        out.push(match code {
            "25" => '%',
            "7B" => '{',
            "7D" => '}',
            _ => return None,
        });
        rest = &rest[at + 3..];
    }
    out.push_str(rest);
    Some(out)
}

/// The hash slot of a key (CRC16/XMODEM of its hash tag, mod 16384), as Redis Cluster computes
/// it: renewals are batched per slot there.
pub(crate) fn hash_slot(key: &[u8]) -> u16 {
    let tagged = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            rest.iter()
                .position(|&b| b == b'}')
                .filter(|&close| close > 0)
                .map(|close| &rest[..close])
        })
        .unwrap_or(key);
    let mut crc: u16 = 0;
    for &byte in tagged {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16384
}

#[cfg(test)]
mod tests;
