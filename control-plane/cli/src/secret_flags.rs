//! Secrets given as flags: every user of the host reads them in `ps` and
//! /proc/PID/cmdline, so the CLI warns of each and names its variable.

#[cfg(test)]
use drover::cli::Cli;

/// The secrets a flag may carry, and the variable that carries each
/// without showing it to the host's other users.
const SECRET_FLAGS: &[(&str, &str, &str)] = &[
    (
        "token",
        "--token",
        "DROVER_TOKEN (or a context's token file)",
    ),
    ("nats_password", "--nats-password", "DROVER_NATS_PASSWORD"),
    ("mqtt_password", "--mqtt-password", "DROVER_MQTT_PASSWORD"),
];

/// A warning for each secret given as a flag on the command line (the
/// subcommands' too): every user of the host reads it in `ps` and
/// /proc/PID/cmdline for as long as the command runs.
pub fn secrets_on_command_line(matches: &clap::ArgMatches) -> Vec<String> {
    let mut warnings = Vec::new();
    let mut level = Some(matches);
    while let Some(m) = level {
        for (id, flag, instead) in SECRET_FLAGS {
            let given = m.try_get_raw(id).ok().flatten().is_some_and(|_| {
                m.value_source(id) == Some(clap::parser::ValueSource::CommandLine)
            });
            if given
                && !warnings
                    .iter()
                    .any(|w: &String| w.starts_with(&format!("{flag} ")))
            {
                warnings.push(format!(
                    "{flag} was given on the command line, where every user of this host can \
                     read it (ps, /proc/PID/cmdline); set {instead} instead"
                ));
            }
        }
        level = m.subcommand().map(|(_, sub)| sub);
    }
    warnings
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_secret_given_as_a_flag_is_warned_of_once() {
        let matches = |args: &[&str]| {
            <Cli as clap::CommandFactory>::command()
                .try_get_matches_from(args)
                .expect("parses")
        };
        let warned = secrets_on_command_line(&matches(&[
            "drover",
            "--token",
            "t",
            "serve",
            "--nats-url",
            "nats://127.0.0.1:4222",
            "--nats-password",
            "p",
        ]));
        assert_eq!(warned.len(), 2, "{warned:?}");
        assert!(warned[0].starts_with("--token ") && warned[0].contains("DROVER_TOKEN"));
        assert!(
            warned[1].starts_with("--nats-password ") && warned[1].contains("DROVER_NATS_PASSWORD")
        );
        assert!(secrets_on_command_line(&matches(&["drover", "get", "devices"])).is_empty());
    }
}
