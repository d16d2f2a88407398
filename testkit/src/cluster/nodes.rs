//! `CLUSTER NODES` and `CLUSTER INFO` replies, parsed.

/// One line of `CLUSTER NODES`: how one node sees another.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeView {
    /// Node id.
    pub id: String,
    /// Client port.
    pub port: u16,
    /// Flags: `myself`, `master`, `slave`, `fail?`, `fail`, `handshake`, `noaddr`, ...
    pub flags: Vec<String>,
    /// The master's id, for a replica.
    pub master_id: Option<String>,
    /// Whether the cluster bus link is `connected`.
    pub connected: bool,
    /// Slot ranges served (inclusive).
    pub slots: Vec<(u16, u16)>,
}

impl NodeView {
    /// Whether the node has `flag`.
    pub fn has(&self, flag: &str) -> bool {
        self.flags.iter().any(|f| f == flag)
    }

    /// A master not flagged failing (`fail` or `fail?`).
    pub fn is_healthy_master(&self) -> bool {
        self.has("master") && !self.has("fail") && !self.has("fail?")
    }

    /// Whether the node serves `slot`.
    pub fn serves(&self, slot: u16) -> bool {
        self.slots.iter().any(|&(lo, hi)| lo <= slot && slot <= hi)
    }
}

/// Parses a `CLUSTER NODES` reply.
pub fn parse_cluster_nodes(text: &str) -> Vec<NodeView> {
    text.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.len() < 8 {
                return None;
            }
            // `ip:port@cport[,hostname]`
            let port = fields[1]
                .split('@')
                .next()?
                .rsplit(':')
                .next()?
                .parse()
                .ok()?;
            let slots = fields[8..]
                .iter()
                .filter(|s| !s.starts_with('['))
                .filter_map(|s| match s.split_once('-') {
                    Some((lo, hi)) => Some((lo.parse().ok()?, hi.parse().ok()?)),
                    None => s.parse().ok().map(|n| (n, n)),
                })
                .collect();
            Some(NodeView {
                id: fields[0].to_owned(),
                port,
                flags: fields[2].split(',').map(str::to_owned).collect(),
                master_id: (fields[3] != "-").then(|| fields[3].to_owned()),
                connected: fields[7] == "connected",
                slots,
            })
        })
        .collect()
}

/// The value of `field` in an `INFO`/`CLUSTER INFO` reply.
pub(super) fn info_field<'a>(info: &'a str, field: &str) -> Option<&'a str> {
    info.lines()
        .find_map(|l| l.trim().strip_prefix(field)?.strip_prefix(':'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_nodes_lines_parse() {
        let text = "\
07c37dfeb235213a872192d90877d0cd55635b91 127.0.0.1:30004@31004,host replica e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca 0 1426238317239 4 connected
e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca 127.0.0.1:30001@31001 myself,master - 0 0 1 connected 0-5460 7000 [5461->-292f8b365bb7edb5e285caf0b7e6ddc7265d2f4f]
292f8b365bb7edb5e285caf0b7e6ddc7265d2f4f 127.0.0.1:30002@31002 master,fail - 1426238316232 1426238314219 2 disconnected 5461-10922
";
        let views = parse_cluster_nodes(text);
        assert_eq!(views.len(), 3);
        assert_eq!(views[0].port, 30004);
        assert_eq!(
            views[0].master_id.as_deref(),
            Some("e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca")
        );
        assert!(views[0].connected);
        assert!(views[1].has("myself") && views[1].is_healthy_master());
        assert_eq!(views[1].slots, vec![(0, 5460), (7000, 7000)]);
        assert!(views[1].serves(7000) && !views[1].serves(7001));
        assert!(!views[2].is_healthy_master() && !views[2].connected);
        assert_eq!(
            info_field("cluster_state:ok\r\ncluster_size:3\r\n", "cluster_state"),
            Some("ok")
        );
    }
}
