//! The command line: `--quick`, `--only <sections>`, `--help`.

/// Printed by `--help` and after a bad argument.
pub(crate) const USAGE: &str = "\
usage: dlock-bench [--quick] [--only SECTION,...]

  --quick         smaller counts and shorter holds in every section
  --only LIST     run just these sections (comma-separated, in the table's order):
                  seq, par, hot, many, macro, multi, cp, peer, prim, multikey
  -h, --help      print this

The cp section (etcd and ZooKeeper) needs the cp-engines feature. The peer section
compares with rslock; DLOCK_BENCH_RSLOCK_RETRY=COUNT,DELAY_MS sets its retries.";

/// A section of the table, one workload family (or half of one).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Section {
    Seq,
    Par,
    Hot,
    Many,
    Macro,
    Multi,
    Cp,
    Peer,
    Prim,
    MultiKey,
}

impl Section {
    /// Every section, in the order the table prints them.
    pub(crate) const ALL: [Section; 10] = [
        Section::Seq,
        Section::Par,
        Section::Hot,
        Section::Many,
        Section::Macro,
        Section::Multi,
        Section::Cp,
        Section::Peer,
        Section::Prim,
        Section::MultiKey,
    ];

    fn name(self) -> &'static str {
        match self {
            Section::Seq => "seq",
            Section::Par => "par",
            Section::Hot => "hot",
            Section::Many => "many",
            Section::Macro => "macro",
            Section::Multi => "multi",
            Section::Cp => "cp",
            Section::Peer => "peer",
            Section::Prim => "prim",
            Section::MultiKey => "multikey",
        }
    }
}

/// What the command line asked for.
#[derive(Clone, Debug, Default)]
pub(crate) struct Options {
    /// Smaller counts (`--quick`).
    pub(crate) quick: bool,
    /// The sections of `--only`; `None` runs them all.
    only: Option<Vec<Section>>,
}

impl Options {
    /// Reads the arguments after the program name; `Ok(None)` for `--help`.
    pub(crate) fn parse(args: impl IntoIterator<Item = String>) -> Result<Option<Self>, String> {
        let mut options = Options::default();
        let mut args = args.into_iter();
        while let Some(arg) = args.next() {
            match arg.as_str() {
                "--quick" => options.quick = true,
                "--only" => {
                    let list = args.next().ok_or("--only needs a list of sections")?;
                    let sections = list.split(',').map(|name| {
                        Section::ALL
                            .into_iter()
                            .find(|s| s.name() == name)
                            .ok_or_else(|| format!("unknown section `{name}`"))
                    });
                    options.only = Some(sections.collect::<Result<_, _>>()?);
                }
                "-h" | "--help" => return Ok(None),
                other => return Err(format!("unknown argument `{other}`")),
            }
        }
        Ok(Some(options))
    }

    /// Whether `section` runs.
    pub(crate) fn wants(&self, section: Section) -> bool {
        self.only
            .as_ref()
            .is_none_or(|only| only.contains(&section))
    }

    /// The multiplier of the counts of most sections: 1 with `--quick`, 4 otherwise.
    pub(crate) fn scale(&self) -> usize {
        if self.quick { 1 } else { 4 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Option<Options>, String> {
        Options::parse(args.iter().map(|a| a.to_string()))
    }

    #[test]
    fn no_arguments_run_every_section_at_full_scale() {
        let options = parse(&[]).unwrap().unwrap();
        assert_eq!(options.scale(), 4);
        assert!(Section::ALL.into_iter().all(|s| options.wants(s)));
    }

    #[test]
    fn only_and_quick_narrow_the_run() {
        let options = parse(&["--only", "seq,cp", "--quick"]).unwrap().unwrap();
        assert_eq!(options.scale(), 1);
        let run: Vec<_> = Section::ALL
            .into_iter()
            .filter(|&s| options.wants(s))
            .collect();
        assert_eq!(run, [Section::Seq, Section::Cp]);
    }

    #[test]
    fn unknown_sections_and_arguments_are_errors() {
        assert_eq!(
            parse(&["--only", "seq,hott"]).unwrap_err(),
            "unknown section `hott`"
        );
        assert_eq!(parse(&["--fast"]).unwrap_err(), "unknown argument `--fast`");
        assert!(parse(&["--only"]).is_err());
        assert!(parse(&["--help"]).unwrap().is_none());
    }
}
