# Print an optspec for argparse to handle cmd's options that are independent of any subcommand.
function __fish_drover_global_optspecs
    string join \n server= ca-file= token= context= data= h/help V/version
end

function __fish_drover_needs_command
    # Figure out if the current invocation already has a command.
    set -l cmd (commandline -opc)
    set -e cmd[1]
    argparse -s (__fish_drover_global_optspecs) -- $cmd 2>/dev/null
    or return
    if set -q argv[1]
        # Also print the command, so this can be used to figure out what it is.
        echo $argv[1]
        return 1
    end
    return 0
end

function __fish_drover_using_subcommand
    set -l cmd (__fish_drover_needs_command)
    test -z "$cmd"
    and return 1
    contains -- $cmd[1] $argv
end

complete -c drover -n "__fish_drover_needs_command" -l server -d 'The control plane\'s API (default: the context\'s, else http://127.0.0.1:7180)' -r
complete -c drover -n "__fish_drover_needs_command" -l ca-file -d 'For an https:// server: the CA bundle to trust, or the server\'s own self-signed certificate (default: the context\'s, else the system\'s CAs)' -r -F
complete -c drover -n "__fish_drover_needs_command" -l token -d 'The operator token (default: the context\'s token file, else DATA/operator.token)' -r
complete -c drover -n "__fish_drover_needs_command" -l context -d 'The context to use from the CLI\'s config (~/.config/drover/config.toml, or DROVER_CONFIG); default: the current one (`drover config use-context`)' -r
complete -c drover -n "__fish_drover_needs_command" -l data -d 'The control plane\'s data directory' -r -F
complete -c drover -n "__fish_drover_needs_command" -s h -l help -d 'Print help'
complete -c drover -n "__fish_drover_needs_command" -s V -l version -d 'Print version'
complete -c drover -n "__fish_drover_needs_command" -f -a "serve" -d 'Run the control plane: the embedded store in --data by default, or NATS JetStream (--store nats) for several replicas'
complete -c drover -n "__fish_drover_needs_command" -f -a "nats-config" -d 'Print a nats-server authorization block: the control plane may do anything; each device may read only its own intents and send only its own statuses, hello and heartbeat to the control plane, and may write no bucket (its password is derived from its device token and written as a bcrypt hash)'
complete -c drover -n "__fish_drover_needs_command" -f -a "mqtt-config" -d 'Write mosquitto\'s password and ACL files for the control plane and these devices (a device may read only its own intents and write only its own status, hello and heartbeat; its password is derived from its token), and print the mosquitto.conf lines that use them. Run it on the control plane\'s host with its --data'
complete -c drover -n "__fish_drover_needs_command" -f -a "apply" -d 'Create or configure resources from a YAML or JSON file'
complete -c drover -n "__fish_drover_needs_command" -f -a "get" -d 'Show devices, taskruns, taskschedules, deployments or packages: all of a kind, or with NAME that one (exit 1 when there is none). Each kind goes by its plural, its singular or a short name (dev, tr, ts, deploy, pkg)'
complete -c drover -n "__fish_drover_needs_command" -f -a "runs" -d 'Follow task runs and deployments'
complete -c drover -n "__fish_drover_needs_command" -f -a "describe" -d 'Show one resource in detail: a deployment\'s counts, each site\'s window now, its latest errors and the retries waiting'
complete -c drover -n "__fish_drover_needs_command" -f -a "logs" -d 'A job\'s whole output, fetched from the device through its transport as it answers: each apt and dpkg call with its command and exit status, then what it printed (apt\'s and dpkg\'s own words, the maintainer scripts\'). The device keeps its jobs\' output for 30 days and 32 MiB; at most the last 4 MiB of one job come back'
complete -c drover -n "__fish_drover_needs_command" -f -a "patch-status" -d 'The fleet\'s patch status from each device\'s latest assessment: up to date, with updates or security updates pending (and how long the oldest has waited), a reboot pending, not assessed lately'
complete -c drover -n "__fish_drover_needs_command" -f -a "cancel" -d 'Cancel a task run or a deployment: nothing more is released, jobs that have not started on their devices are canceled there, and jobs that have started run to their end (an upgrade is never cut short). It ends Failed with reason Canceled once every job is decided; `drover runs watch NAME` follows it'
complete -c drover -n "__fish_drover_needs_command" -f -a "delete" -d 'Delete a finished task run or deployment (its record, targets and jobs), a device (its registry record, inventory and finished jobs), a task schedule, a Secret or a package. What is still going is refused with the command to run first: cancel a run or a deployment; a Secret or a package an unfinished deployment needs stays'
complete -c drover -n "__fish_drover_needs_command" -f -a "deployments" -d 'Act on deployments'
complete -c drover -n "__fish_drover_needs_command" -f -a "alerts" -d 'What needs an operator\'s eye: failed canaries and deployments, runs past their deadline, devices offline, in a resume loop, with a security update waiting, a reboot pending or no recent assessment. Each says whether, by whom and when it was acknowledged'
complete -c drover -n "__fish_drover_needs_command" -f -a "operators" -d 'Named operators, each with a role (viewer, operator, admin) and its own token: add, list, rotate, revoke. The bootstrap token (DATA/operator.token) is the admin named `admin`'
complete -c drover -n "__fish_drover_needs_command" -f -a "enrollment-tokens" -d 'Enrollment tokens: one in a device image lets every device made from it ask to join (create, list, revoke)'
complete -c drover -n "__fish_drover_needs_command" -f -a "devices" -d 'Devices that enrolled their own key: pending, accept, reject'
complete -c drover -n "__fish_drover_needs_command" -f -a "audit" -d 'The audit log: every change (who, what, when, from where, the outcome) and every refused request, oldest first'
complete -c drover -n "__fish_drover_needs_command" -f -a "packages" -d 'The package store (for packageInstallV1 deployments)'
complete -c drover -n "__fish_drover_needs_command" -f -a "config" -d 'The CLI\'s contexts: control planes by name, each with its server, CA and token file (kept in ~/.config/drover/config.toml, or DROVER_CONFIG; the token stays in its file)'
complete -c drover -n "__fish_drover_needs_command" -f -a "token" -d 'Print the bearer token a device\'s agent uses. Refused for a device the control plane does not know (it asks the API), unless --unregistered'
complete -c drover -n "__fish_drover_needs_command" -f -a "reset-store" -d 'Move a damaged or empty control-plane database aside (DATA/drover.redb); the next `serve` starts with a new, empty one. Refused while a `serve` holds the database; asks first unless --yes'
complete -c drover -n "__fish_drover_needs_command" -f -a "verify-store" -d 'Check one database file (serve runs this before opening it)'
complete -c drover -n "__fish_drover_needs_command" -f -a "intent-key" -d 'Print the public key agents pin to check the control plane\'s intent signatures (`intent_public_keys` in the agent\'s config). Run it on the control plane\'s host with its --data'
complete -c drover -n "__fish_drover_needs_command" -f -a "init" -d 'Make the data directory\'s keys before the first `serve` (device-token key, operator token, intent key), and with --tls-name a CA and a server certificate for those names: DATA/tls/server.pem and server.key for `serve`, DATA/tls/ca.pem for every agent (ca_file) and operator (DROVER_CA_FILE). Keeps whatever exists'
complete -c drover -n "__fish_drover_needs_command" -f -a "demo" -d 'Run the end-to-end demo: control plane, agents and a task run'
complete -c drover -n "__fish_drover_needs_command" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c drover -n "__fish_drover_using_subcommand serve" -l listen -r
complete -c drover -n "__fish_drover_using_subcommand serve" -l agent-listen -d 'Where agents connect over WebSocket' -r
complete -c drover -n "__fish_drover_using_subcommand serve" -l agent-tls-cert -d 'PEM certificate chain for wss:// (with --agent-tls-key)' -r -F
complete -c drover -n "__fish_drover_using_subcommand serve" -l agent-tls-key -r -F
complete -c drover -n "__fish_drover_using_subcommand serve" -l api-tls-cert -d 'PEM certificate chain: serve the operators\' API over https (with --api-tls-key). Without it the API is served only on loopback' -r -F
complete -c drover -n "__fish_drover_using_subcommand serve" -l api-tls-key -r -F
complete -c drover -n "__fish_drover_using_subcommand serve" -l ack-timeout-seconds -d 'A job sent but not acked within this returns to `created`' -r
complete -c drover -n "__fish_drover_using_subcommand serve" -l pass-interval-ms -r
complete -c drover -n "__fish_drover_using_subcommand serve" -l max-agent-connections -d 'Agent connections held at once (keep it below the open-file limit, LimitNOFILE in drover.service); more are closed at once' -r
complete -c drover -n "__fish_drover_using_subcommand serve" -l download-listen -d 'Where agents download packages (PackageInstallV1), with the same TLS as --agent-listen. Default: the agents\' address on port 7182 (an ephemeral port when --agent-listen\'s is 0)' -r
complete -c drover -n "__fish_drover_using_subcommand serve" -l download-url -d 'The base of download links as agents reach it (https://host:port). Default: the listen address; for a wildcard one (0.0.0.0), the first DNS name of --agent-tls-cert' -r
complete -c drover -n "__fish_drover_using_subcommand serve" -l offline-alert-minutes -d 'The dashboard (and GET /api/v1/alerts) raises an alert for a device not heard from for this long' -r
complete -c drover -n "__fish_drover_using_subcommand serve" -l security-alert-days -d 'An alert for a device whose oldest pending security update has waited longer than this (from the first assessment that saw it)' -r
complete -c drover -n "__fish_drover_using_subcommand serve" -l reboot-alert-hours -d 'An alert for a device with a reboot pending for longer than this' -r
complete -c drover -n "__fish_drover_using_subcommand serve" -l package-quota -d 'The most the package store (the uploaded .debs in --data) may hold, e.g. 20GiB or 500MiB; an upload that would pass it is refused (507) and nothing of it is kept' -r
complete -c drover -n "__fish_drover_using_subcommand serve" -l upload-stall-seconds -d 'An upload that sends no bytes for this many seconds is cut off (408); a slow upload that keeps moving is never cut off' -r
complete -c drover -n "__fish_drover_using_subcommand serve" -l audit-retention-days -d 'Days the audit log keeps an entry (every change and every refused request); older ones are deleted each hour' -r
complete -c drover -n "__fish_drover_using_subcommand serve" -l history-jobs-per-device -d 'Jobs each device\'s history keeps (newest first) once the run, deployment or schedule that made them is deleted; `describe device` and the device page show them' -r
complete -c drover -n "__fish_drover_using_subcommand serve" -l history-days -d 'Days a device\'s history keeps a job (by when it ended); older ones are deleted each hour' -r
complete -c drover -n "__fish_drover_using_subcommand serve" -l enrollments-per-address-per-minute -d 'Enrollment requests a minute one address may send (all at once, or spread); more are refused with the time to wait. 0: no limit. Applies where the control plane sees the device\'s address (the agents\' WebSocket port)' -r
complete -c drover -n "__fish_drover_using_subcommand serve" -l enrollments-per-token-per-minute -d 'New devices a minute one enrollment token may record (pending or accepted), on every transport; a pending device asking again is not counted. 0: no limit' -r
complete -c drover -n "__fish_drover_using_subcommand serve" -l ready-file -d 'Write the bound addresses here as JSON once listening' -r -F
complete -c drover -n "__fish_drover_using_subcommand serve" -l nats-url -d 'nats://HOST:PORT (or tls://) of a nats-server with JetStream; for a cluster, several, comma-separated' -r
complete -c drover -n "__fish_drover_using_subcommand serve" -l nats-replicas -d 'Copies JetStream keeps of each bucket Drover creates: 1 on one server, 3 on a cluster of three (set before the buckets exist)' -r
complete -c drover -n "__fish_drover_using_subcommand serve" -l nats-user -r
complete -c drover -n "__fish_drover_using_subcommand serve" -l nats-password -r
complete -c drover -n "__fish_drover_using_subcommand serve" -l nats-ca -d 'CA certificate of the nats-server (requires TLS)' -r -F
complete -c drover -n "__fish_drover_using_subcommand serve" -l nats-authority -d 'Servers that trust Drover\'s operator (`drover nats-config --authority DIR`): the keys there sign this control plane\'s own JWT (instead of --nats-user and --nats-password), each accepted device\'s JWT, and the revocations pushed to the servers. Keep DIR outside the data directory, readable by this control plane only' -r -F
complete -c drover -n "__fish_drover_using_subcommand serve" -l nats-logins-per-second -d 'Logins a second the NATS servers take: agents spread their first reconnect after a lost connection over the devices heard from divided by this (decision 0020); 0 for no spread' -r
complete -c drover -n "__fish_drover_using_subcommand serve" -l mqtt-url -d 'mqtt://HOST:PORT (or mqtts://) of the broker (mosquitto)' -r
complete -c drover -n "__fish_drover_using_subcommand serve" -l mqtt-user -r
complete -c drover -n "__fish_drover_using_subcommand serve" -l mqtt-password -r
complete -c drover -n "__fish_drover_using_subcommand serve" -l mqtt-ca -d 'CA certificate of the broker (mqtts://)' -r -F
complete -c drover -n "__fish_drover_using_subcommand serve" -l mqtt-prefix -d 'Topic prefix' -r
complete -c drover -n "__fish_drover_using_subcommand serve" -l mqtt-request-queue -d 'Requests (publishes, acknowledgements, subscriptions) that may wait for the link to send them; more wait in tasks of their own' -r
complete -c drover -n "__fish_drover_using_subcommand serve" -l mqtt-keep-alive-seconds -d 'The MQTT keep-alive: the broker drops a control plane silent for 1.5 times this, and the link calls itself stalled (and reconnects) after as long without moving' -r
complete -c drover -n "__fish_drover_using_subcommand serve" -l store -d 'Where the control plane keeps its state: `embedded` (redb in --data; one replica) or `nats` (JetStream KV; several replicas)' -r -f -a "embedded\t''
nats\t''"
complete -c drover -n "__fish_drover_using_subcommand serve" -l server -d 'The control plane\'s API (default: the context\'s, else http://127.0.0.1:7180)' -r
complete -c drover -n "__fish_drover_using_subcommand serve" -l ca-file -d 'For an https:// server: the CA bundle to trust, or the server\'s own self-signed certificate (default: the context\'s, else the system\'s CAs)' -r -F
complete -c drover -n "__fish_drover_using_subcommand serve" -l token -d 'The operator token (default: the context\'s token file, else DATA/operator.token)' -r
complete -c drover -n "__fish_drover_using_subcommand serve" -l context -d 'The context to use from the CLI\'s config (~/.config/drover/config.toml, or DROVER_CONFIG); default: the current one (`drover config use-context`)' -r
complete -c drover -n "__fish_drover_using_subcommand serve" -l data -d 'The control plane\'s data directory' -r -F
complete -c drover -n "__fish_drover_using_subcommand serve" -l api-allow-plaintext -d 'Serve the API in clear on a non-loopback --listen address (only behind a TLS-terminating proxy)'
complete -c drover -n "__fish_drover_using_subcommand serve" -s h -l help -d 'Print help'
complete -c drover -n "__fish_drover_using_subcommand nats-config" -l device -d 'A device to authorize by its token (repeat for each)' -r
complete -c drover -n "__fish_drover_using_subcommand nats-config" -l control-plane-user -r
complete -c drover -n "__fish_drover_using_subcommand nats-config" -l control-plane-password -d 'The control plane\'s own NATS password (better given in DROVER_NATS_PASSWORD than on the command line)' -r
complete -c drover -n "__fish_drover_using_subcommand nats-config" -l authority -d 'Let devices join by themselves (`drover enrollment-tokens`): the servers trust Drover\'s operator once, whose keys are made in DIR (outside the data directory; the control plane serves with `--nats-authority DIR`), and take each device by the JWT the control plane signs it when it is accepted. Prints the servers\' lines and the `enrollment_jwt` every device\'s config carries' -r -F
complete -c drover -n "__fish_drover_using_subcommand nats-config" -l resolver-dir -d 'Where the servers keep the accounts\' JWTs (with --authority): a directory nats-server\'s user may write' -r -F
complete -c drover -n "__fish_drover_using_subcommand nats-config" -l out -d 'Write the block to this file (replaced whole) for nats-server\'s `include`, instead of printing it: running it again never duplicates the block' -r -F
complete -c drover -n "__fish_drover_using_subcommand nats-config" -l group -d 'The group the --out file is given (mode 0640), so nats-server reads it as its own user: Debian\'s runs as `nats`. Empty: leave the group as it is' -r
complete -c drover -n "__fish_drover_using_subcommand nats-config" -l server -d 'The control plane\'s API (default: the context\'s, else http://127.0.0.1:7180)' -r
complete -c drover -n "__fish_drover_using_subcommand nats-config" -l ca-file -d 'For an https:// server: the CA bundle to trust, or the server\'s own self-signed certificate (default: the context\'s, else the system\'s CAs)' -r -F
complete -c drover -n "__fish_drover_using_subcommand nats-config" -l token -d 'The operator token (default: the context\'s token file, else DATA/operator.token)' -r
complete -c drover -n "__fish_drover_using_subcommand nats-config" -l context -d 'The context to use from the CLI\'s config (~/.config/drover/config.toml, or DROVER_CONFIG); default: the current one (`drover config use-context`)' -r
complete -c drover -n "__fish_drover_using_subcommand nats-config" -l data -d 'The control plane\'s data directory' -r -F
complete -c drover -n "__fish_drover_using_subcommand nats-config" -l cluster -d 'Also print, as comments, what each node of a three-node JetStream cluster needs and how replicas and agents name the nodes'
complete -c drover -n "__fish_drover_using_subcommand nats-config" -l allow-direct-status-puts -d 'Also let each device put its statuses into the status bucket itself, as agents did before statuses became requests to the control plane. Only while such agents remain: a device that may put there can fill the bucket for every device'
complete -c drover -n "__fish_drover_using_subcommand nats-config" -l offline -d 'Take every device\'s token as never rotated instead of asking the control plane (`GET /api/v1/devices/token-generations`) which were: for a first set-up before `serve` runs. Without it, a control plane not listening is taken the same way, and said so'
complete -c drover -n "__fish_drover_using_subcommand nats-config" -s h -l help -d 'Print help'
complete -c drover -n "__fish_drover_using_subcommand mqtt-config" -l device -d 'A device to authorize by its token (repeat for each)' -r
complete -c drover -n "__fish_drover_using_subcommand mqtt-config" -l dynamic-security -d 'Let devices join by themselves (`drover enrollment-tokens`): write mosquitto\'s dynamic security plugin\'s file here unless it exists (from then on the broker keeps it, and the control plane adds and removes each accepted device\'s login; this never replaces it), and print the plugin\'s lines. In a directory the broker\'s user may write: Debian\'s /var/lib/mosquitto' -r -F
complete -c drover -n "__fish_drover_using_subcommand mqtt-config" -l control-plane-user -d 'The control plane\'s broker user; repeat it to give each replica its own (the broker makes a client\'s id its user name, so two replicas under one user would push each other off). Each replica serves with `--mqtt-user` set to its own' -r
complete -c drover -n "__fish_drover_using_subcommand mqtt-config" -l control-plane-password -r
complete -c drover -n "__fish_drover_using_subcommand mqtt-config" -l prefix -r
complete -c drover -n "__fish_drover_using_subcommand mqtt-config" -l out -d 'Where to write drover.passwd and drover.acl (replaced whole)' -r -F
complete -c drover -n "__fish_drover_using_subcommand mqtt-config" -l group -d 'The group the files are given (mode 0640), so the broker reads them after dropping to its own user: Debian\'s mosquitto runs as `mosquitto`. Empty: leave the group as it is' -r
complete -c drover -n "__fish_drover_using_subcommand mqtt-config" -l server -d 'The control plane\'s API (default: the context\'s, else http://127.0.0.1:7180)' -r
complete -c drover -n "__fish_drover_using_subcommand mqtt-config" -l ca-file -d 'For an https:// server: the CA bundle to trust, or the server\'s own self-signed certificate (default: the context\'s, else the system\'s CAs)' -r -F
complete -c drover -n "__fish_drover_using_subcommand mqtt-config" -l token -d 'The operator token (default: the context\'s token file, else DATA/operator.token)' -r
complete -c drover -n "__fish_drover_using_subcommand mqtt-config" -l context -d 'The context to use from the CLI\'s config (~/.config/drover/config.toml, or DROVER_CONFIG); default: the current one (`drover config use-context`)' -r
complete -c drover -n "__fish_drover_using_subcommand mqtt-config" -l data -d 'The control plane\'s data directory' -r -F
complete -c drover -n "__fish_drover_using_subcommand mqtt-config" -l offline -d 'Take every device\'s token as never rotated instead of asking the control plane (`GET /api/v1/devices/token-generations`) which were: for a first set-up before `serve` runs. Without it, a control plane not listening is taken the same way, and said so'
complete -c drover -n "__fish_drover_using_subcommand mqtt-config" -s h -l help -d 'Print help'
complete -c drover -n "__fish_drover_using_subcommand apply" -s f -l filename -d 'A YAML or JSON file of one or more documents (all validated before any is applied); `-` reads standard input' -r -F
complete -c drover -n "__fish_drover_using_subcommand apply" -l dry-run -d 'Check and preview only (`--dry-run` or `--dry-run=server`): what would be created, configured or refused, and for a TaskRun or a Deployment the targets it would get now and who is left out and why. Nothing is stored' -r -f -a "server\t''"
complete -c drover -n "__fish_drover_using_subcommand apply" -l server -d 'The control plane\'s API (default: the context\'s, else http://127.0.0.1:7180)' -r
complete -c drover -n "__fish_drover_using_subcommand apply" -l ca-file -d 'For an https:// server: the CA bundle to trust, or the server\'s own self-signed certificate (default: the context\'s, else the system\'s CAs)' -r -F
complete -c drover -n "__fish_drover_using_subcommand apply" -l token -d 'The operator token (default: the context\'s token file, else DATA/operator.token)' -r
complete -c drover -n "__fish_drover_using_subcommand apply" -l context -d 'The context to use from the CLI\'s config (~/.config/drover/config.toml, or DROVER_CONFIG); default: the current one (`drover config use-context`)' -r
complete -c drover -n "__fish_drover_using_subcommand apply" -l data -d 'The control plane\'s data directory' -r -F
complete -c drover -n "__fish_drover_using_subcommand apply" -s h -l help -d 'Print help'
complete -c drover -n "__fish_drover_using_subcommand get" -s o -l output -r -f -a "table\t''
wide\t'The table with more columns (devices: OS, architecture, transport, time zone, boot id)'
json\t''
yaml\t''
name\t'`kind/name` per object, one per line (for scripts)'"
complete -c drover -n "__fish_drover_using_subcommand get" -l server -d 'The control plane\'s API (default: the context\'s, else http://127.0.0.1:7180)' -r
complete -c drover -n "__fish_drover_using_subcommand get" -l ca-file -d 'For an https:// server: the CA bundle to trust, or the server\'s own self-signed certificate (default: the context\'s, else the system\'s CAs)' -r -F
complete -c drover -n "__fish_drover_using_subcommand get" -l token -d 'The operator token (default: the context\'s token file, else DATA/operator.token)' -r
complete -c drover -n "__fish_drover_using_subcommand get" -l context -d 'The context to use from the CLI\'s config (~/.config/drover/config.toml, or DROVER_CONFIG); default: the current one (`drover config use-context`)' -r
complete -c drover -n "__fish_drover_using_subcommand get" -l data -d 'The control plane\'s data directory' -r -F
complete -c drover -n "__fish_drover_using_subcommand get" -s w -l watch -d 'After the listing, print a row (or, with -o json|yaml, an object) for every one that changes, until interrupted'
complete -c drover -n "__fish_drover_using_subcommand get" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c drover -n "__fish_drover_using_subcommand runs; and not __fish_seen_subcommand_from watch help" -l server -d 'The control plane\'s API (default: the context\'s, else http://127.0.0.1:7180)' -r
complete -c drover -n "__fish_drover_using_subcommand runs; and not __fish_seen_subcommand_from watch help" -l ca-file -d 'For an https:// server: the CA bundle to trust, or the server\'s own self-signed certificate (default: the context\'s, else the system\'s CAs)' -r -F
complete -c drover -n "__fish_drover_using_subcommand runs; and not __fish_seen_subcommand_from watch help" -l token -d 'The operator token (default: the context\'s token file, else DATA/operator.token)' -r
complete -c drover -n "__fish_drover_using_subcommand runs; and not __fish_seen_subcommand_from watch help" -l context -d 'The context to use from the CLI\'s config (~/.config/drover/config.toml, or DROVER_CONFIG); default: the current one (`drover config use-context`)' -r
complete -c drover -n "__fish_drover_using_subcommand runs; and not __fish_seen_subcommand_from watch help" -l data -d 'The control plane\'s data directory' -r -F
complete -c drover -n "__fish_drover_using_subcommand runs; and not __fish_seen_subcommand_from watch help" -s h -l help -d 'Print help'
complete -c drover -n "__fish_drover_using_subcommand runs; and not __fish_seen_subcommand_from watch help" -f -a "watch" -d 'A live progress bar of a task run or a deployment until it finishes (NAME, or deployment/NAME, taskrun/NAME)'
complete -c drover -n "__fish_drover_using_subcommand runs; and not __fish_seen_subcommand_from watch help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c drover -n "__fish_drover_using_subcommand runs; and __fish_seen_subcommand_from watch" -l server -d 'The control plane\'s API (default: the context\'s, else http://127.0.0.1:7180)' -r
complete -c drover -n "__fish_drover_using_subcommand runs; and __fish_seen_subcommand_from watch" -l ca-file -d 'For an https:// server: the CA bundle to trust, or the server\'s own self-signed certificate (default: the context\'s, else the system\'s CAs)' -r -F
complete -c drover -n "__fish_drover_using_subcommand runs; and __fish_seen_subcommand_from watch" -l token -d 'The operator token (default: the context\'s token file, else DATA/operator.token)' -r
complete -c drover -n "__fish_drover_using_subcommand runs; and __fish_seen_subcommand_from watch" -l context -d 'The context to use from the CLI\'s config (~/.config/drover/config.toml, or DROVER_CONFIG); default: the current one (`drover config use-context`)' -r
complete -c drover -n "__fish_drover_using_subcommand runs; and __fish_seen_subcommand_from watch" -l data -d 'The control plane\'s data directory' -r -F
complete -c drover -n "__fish_drover_using_subcommand runs; and __fish_seen_subcommand_from watch" -s h -l help -d 'Print help'
complete -c drover -n "__fish_drover_using_subcommand runs; and __fish_seen_subcommand_from help" -f -a "watch" -d 'A live progress bar of a task run or a deployment until it finishes (NAME, or deployment/NAME, taskrun/NAME)'
complete -c drover -n "__fish_drover_using_subcommand runs; and __fish_seen_subcommand_from help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c drover -n "__fish_drover_using_subcommand describe" -s o -l output -r -f -a "table\t''
wide\t'The table with more columns (devices: OS, architecture, transport, time zone, boot id)'
json\t''
yaml\t''
name\t'`kind/name` per object, one per line (for scripts)'"
complete -c drover -n "__fish_drover_using_subcommand describe" -l server -d 'The control plane\'s API (default: the context\'s, else http://127.0.0.1:7180)' -r
complete -c drover -n "__fish_drover_using_subcommand describe" -l ca-file -d 'For an https:// server: the CA bundle to trust, or the server\'s own self-signed certificate (default: the context\'s, else the system\'s CAs)' -r -F
complete -c drover -n "__fish_drover_using_subcommand describe" -l token -d 'The operator token (default: the context\'s token file, else DATA/operator.token)' -r
complete -c drover -n "__fish_drover_using_subcommand describe" -l context -d 'The context to use from the CLI\'s config (~/.config/drover/config.toml, or DROVER_CONFIG); default: the current one (`drover config use-context`)' -r
complete -c drover -n "__fish_drover_using_subcommand describe" -l data -d 'The control plane\'s data directory' -r -F
complete -c drover -n "__fish_drover_using_subcommand describe" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c drover -n "__fish_drover_using_subcommand logs" -l tail -d 'Only the last N lines' -r
complete -c drover -n "__fish_drover_using_subcommand logs" -l wait -d 'How long to wait for the device, in seconds (1 to 120)' -r
complete -c drover -n "__fish_drover_using_subcommand logs" -l server -d 'The control plane\'s API (default: the context\'s, else http://127.0.0.1:7180)' -r
complete -c drover -n "__fish_drover_using_subcommand logs" -l ca-file -d 'For an https:// server: the CA bundle to trust, or the server\'s own self-signed certificate (default: the context\'s, else the system\'s CAs)' -r -F
complete -c drover -n "__fish_drover_using_subcommand logs" -l token -d 'The operator token (default: the context\'s token file, else DATA/operator.token)' -r
complete -c drover -n "__fish_drover_using_subcommand logs" -l context -d 'The context to use from the CLI\'s config (~/.config/drover/config.toml, or DROVER_CONFIG); default: the current one (`drover config use-context`)' -r
complete -c drover -n "__fish_drover_using_subcommand logs" -l data -d 'The control plane\'s data directory' -r -F
complete -c drover -n "__fish_drover_using_subcommand logs" -s h -l help -d 'Print help'
complete -c drover -n "__fish_drover_using_subcommand patch-status" -s o -l output -r -f -a "table\t''
wide\t'The table with more columns (devices: OS, architecture, transport, time zone, boot id)'
json\t''
yaml\t''
name\t'`kind/name` per object, one per line (for scripts)'"
complete -c drover -n "__fish_drover_using_subcommand patch-status" -l server -d 'The control plane\'s API (default: the context\'s, else http://127.0.0.1:7180)' -r
complete -c drover -n "__fish_drover_using_subcommand patch-status" -l ca-file -d 'For an https:// server: the CA bundle to trust, or the server\'s own self-signed certificate (default: the context\'s, else the system\'s CAs)' -r -F
complete -c drover -n "__fish_drover_using_subcommand patch-status" -l token -d 'The operator token (default: the context\'s token file, else DATA/operator.token)' -r
complete -c drover -n "__fish_drover_using_subcommand patch-status" -l context -d 'The context to use from the CLI\'s config (~/.config/drover/config.toml, or DROVER_CONFIG); default: the current one (`drover config use-context`)' -r
complete -c drover -n "__fish_drover_using_subcommand patch-status" -l data -d 'The control plane\'s data directory' -r -F
complete -c drover -n "__fish_drover_using_subcommand patch-status" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c drover -n "__fish_drover_using_subcommand cancel" -l server -d 'The control plane\'s API (default: the context\'s, else http://127.0.0.1:7180)' -r
complete -c drover -n "__fish_drover_using_subcommand cancel" -l ca-file -d 'For an https:// server: the CA bundle to trust, or the server\'s own self-signed certificate (default: the context\'s, else the system\'s CAs)' -r -F
complete -c drover -n "__fish_drover_using_subcommand cancel" -l token -d 'The operator token (default: the context\'s token file, else DATA/operator.token)' -r
complete -c drover -n "__fish_drover_using_subcommand cancel" -l context -d 'The context to use from the CLI\'s config (~/.config/drover/config.toml, or DROVER_CONFIG); default: the current one (`drover config use-context`)' -r
complete -c drover -n "__fish_drover_using_subcommand cancel" -l data -d 'The control plane\'s data directory' -r -F
complete -c drover -n "__fish_drover_using_subcommand cancel" -s h -l help -d 'Print help'
complete -c drover -n "__fish_drover_using_subcommand delete" -l server -d 'The control plane\'s API (default: the context\'s, else http://127.0.0.1:7180)' -r
complete -c drover -n "__fish_drover_using_subcommand delete" -l ca-file -d 'For an https:// server: the CA bundle to trust, or the server\'s own self-signed certificate (default: the context\'s, else the system\'s CAs)' -r -F
complete -c drover -n "__fish_drover_using_subcommand delete" -l token -d 'The operator token (default: the context\'s token file, else DATA/operator.token)' -r
complete -c drover -n "__fish_drover_using_subcommand delete" -l context -d 'The context to use from the CLI\'s config (~/.config/drover/config.toml, or DROVER_CONFIG); default: the current one (`drover config use-context`)' -r
complete -c drover -n "__fish_drover_using_subcommand delete" -l data -d 'The control plane\'s data directory' -r -F
complete -c drover -n "__fish_drover_using_subcommand delete" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c drover -n "__fish_drover_using_subcommand deployments; and not __fish_seen_subcommand_from add-new-devices help" -l server -d 'The control plane\'s API (default: the context\'s, else http://127.0.0.1:7180)' -r
complete -c drover -n "__fish_drover_using_subcommand deployments; and not __fish_seen_subcommand_from add-new-devices help" -l ca-file -d 'For an https:// server: the CA bundle to trust, or the server\'s own self-signed certificate (default: the context\'s, else the system\'s CAs)' -r -F
complete -c drover -n "__fish_drover_using_subcommand deployments; and not __fish_seen_subcommand_from add-new-devices help" -l token -d 'The operator token (default: the context\'s token file, else DATA/operator.token)' -r
complete -c drover -n "__fish_drover_using_subcommand deployments; and not __fish_seen_subcommand_from add-new-devices help" -l context -d 'The context to use from the CLI\'s config (~/.config/drover/config.toml, or DROVER_CONFIG); default: the current one (`drover config use-context`)' -r
complete -c drover -n "__fish_drover_using_subcommand deployments; and not __fish_seen_subcommand_from add-new-devices help" -l data -d 'The control plane\'s data directory' -r -F
complete -c drover -n "__fish_drover_using_subcommand deployments; and not __fish_seen_subcommand_from add-new-devices help" -s h -l help -d 'Print help'
complete -c drover -n "__fish_drover_using_subcommand deployments; and not __fish_seen_subcommand_from add-new-devices help" -f -a "add-new-devices" -d 'Run a deployment\'s targeting again and add the devices that match now and are not targets yet (within its 20,000 targets)'
complete -c drover -n "__fish_drover_using_subcommand deployments; and not __fish_seen_subcommand_from add-new-devices help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c drover -n "__fish_drover_using_subcommand deployments; and __fish_seen_subcommand_from add-new-devices" -l server -d 'The control plane\'s API (default: the context\'s, else http://127.0.0.1:7180)' -r
complete -c drover -n "__fish_drover_using_subcommand deployments; and __fish_seen_subcommand_from add-new-devices" -l ca-file -d 'For an https:// server: the CA bundle to trust, or the server\'s own self-signed certificate (default: the context\'s, else the system\'s CAs)' -r -F
complete -c drover -n "__fish_drover_using_subcommand deployments; and __fish_seen_subcommand_from add-new-devices" -l token -d 'The operator token (default: the context\'s token file, else DATA/operator.token)' -r
complete -c drover -n "__fish_drover_using_subcommand deployments; and __fish_seen_subcommand_from add-new-devices" -l context -d 'The context to use from the CLI\'s config (~/.config/drover/config.toml, or DROVER_CONFIG); default: the current one (`drover config use-context`)' -r
complete -c drover -n "__fish_drover_using_subcommand deployments; and __fish_seen_subcommand_from add-new-devices" -l data -d 'The control plane\'s data directory' -r -F
complete -c drover -n "__fish_drover_using_subcommand deployments; and __fish_seen_subcommand_from add-new-devices" -s h -l help -d 'Print help'
complete -c drover -n "__fish_drover_using_subcommand deployments; and __fish_seen_subcommand_from help" -f -a "add-new-devices" -d 'Run a deployment\'s targeting again and add the devices that match now and are not targets yet (within its 20,000 targets)'
complete -c drover -n "__fish_drover_using_subcommand deployments; and __fish_seen_subcommand_from help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c drover -n "__fish_drover_using_subcommand alerts; and not __fish_seen_subcommand_from ack help" -s o -l output -r -f -a "table\t''
wide\t'The table with more columns (devices: OS, architecture, transport, time zone, boot id)'
json\t''
yaml\t''
name\t'`kind/name` per object, one per line (for scripts)'"
complete -c drover -n "__fish_drover_using_subcommand alerts; and not __fish_seen_subcommand_from ack help" -l server -d 'The control plane\'s API (default: the context\'s, else http://127.0.0.1:7180)' -r
complete -c drover -n "__fish_drover_using_subcommand alerts; and not __fish_seen_subcommand_from ack help" -l ca-file -d 'For an https:// server: the CA bundle to trust, or the server\'s own self-signed certificate (default: the context\'s, else the system\'s CAs)' -r -F
complete -c drover -n "__fish_drover_using_subcommand alerts; and not __fish_seen_subcommand_from ack help" -l token -d 'The operator token (default: the context\'s token file, else DATA/operator.token)' -r
complete -c drover -n "__fish_drover_using_subcommand alerts; and not __fish_seen_subcommand_from ack help" -l context -d 'The context to use from the CLI\'s config (~/.config/drover/config.toml, or DROVER_CONFIG); default: the current one (`drover config use-context`)' -r
complete -c drover -n "__fish_drover_using_subcommand alerts; and not __fish_seen_subcommand_from ack help" -l data -d 'The control plane\'s data directory' -r -F
complete -c drover -n "__fish_drover_using_subcommand alerts; and not __fish_seen_subcommand_from ack help" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c drover -n "__fish_drover_using_subcommand alerts; and not __fish_seen_subcommand_from ack help" -f -a "ack" -d 'Acknowledge an alert as it stands: listed as acknowledged while its condition lasts, raised again once it clears and returns'
complete -c drover -n "__fish_drover_using_subcommand alerts; and not __fish_seen_subcommand_from ack help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c drover -n "__fish_drover_using_subcommand alerts; and __fish_seen_subcommand_from ack" -l server -d 'The control plane\'s API (default: the context\'s, else http://127.0.0.1:7180)' -r
complete -c drover -n "__fish_drover_using_subcommand alerts; and __fish_seen_subcommand_from ack" -l ca-file -d 'For an https:// server: the CA bundle to trust, or the server\'s own self-signed certificate (default: the context\'s, else the system\'s CAs)' -r -F
complete -c drover -n "__fish_drover_using_subcommand alerts; and __fish_seen_subcommand_from ack" -l token -d 'The operator token (default: the context\'s token file, else DATA/operator.token)' -r
complete -c drover -n "__fish_drover_using_subcommand alerts; and __fish_seen_subcommand_from ack" -l context -d 'The context to use from the CLI\'s config (~/.config/drover/config.toml, or DROVER_CONFIG); default: the current one (`drover config use-context`)' -r
complete -c drover -n "__fish_drover_using_subcommand alerts; and __fish_seen_subcommand_from ack" -l data -d 'The control plane\'s data directory' -r -F
complete -c drover -n "__fish_drover_using_subcommand alerts; and __fish_seen_subcommand_from ack" -s h -l help -d 'Print help'
complete -c drover -n "__fish_drover_using_subcommand alerts; and __fish_seen_subcommand_from help" -f -a "ack" -d 'Acknowledge an alert as it stands: listed as acknowledged while its condition lasts, raised again once it clears and returns'
complete -c drover -n "__fish_drover_using_subcommand alerts; and __fish_seen_subcommand_from help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c drover -n "__fish_drover_using_subcommand operators; and not __fish_seen_subcommand_from list add rotate revoke help" -l server -d 'The control plane\'s API (default: the context\'s, else http://127.0.0.1:7180)' -r
complete -c drover -n "__fish_drover_using_subcommand operators; and not __fish_seen_subcommand_from list add rotate revoke help" -l ca-file -d 'For an https:// server: the CA bundle to trust, or the server\'s own self-signed certificate (default: the context\'s, else the system\'s CAs)' -r -F
complete -c drover -n "__fish_drover_using_subcommand operators; and not __fish_seen_subcommand_from list add rotate revoke help" -l token -d 'The operator token (default: the context\'s token file, else DATA/operator.token)' -r
complete -c drover -n "__fish_drover_using_subcommand operators; and not __fish_seen_subcommand_from list add rotate revoke help" -l context -d 'The context to use from the CLI\'s config (~/.config/drover/config.toml, or DROVER_CONFIG); default: the current one (`drover config use-context`)' -r
complete -c drover -n "__fish_drover_using_subcommand operators; and not __fish_seen_subcommand_from list add rotate revoke help" -l data -d 'The control plane\'s data directory' -r -F
complete -c drover -n "__fish_drover_using_subcommand operators; and not __fish_seen_subcommand_from list add rotate revoke help" -s h -l help -d 'Print help'
complete -c drover -n "__fish_drover_using_subcommand operators; and not __fish_seen_subcommand_from list add rotate revoke help" -f -a "list" -d 'Every operator, its role and whether it is revoked'
complete -c drover -n "__fish_drover_using_subcommand operators; and not __fish_seen_subcommand_from list add rotate revoke help" -f -a "add" -d 'Add an operator and print its token (shown once, stored as a digest)'
complete -c drover -n "__fish_drover_using_subcommand operators; and not __fish_seen_subcommand_from list add rotate revoke help" -f -a "rotate" -d 'Give an operator a new token; the old one and its dashboard sessions stop working at once'
complete -c drover -n "__fish_drover_using_subcommand operators; and not __fish_seen_subcommand_from list add rotate revoke help" -f -a "revoke" -d 'Revoke an operator: its token and dashboard sessions are refused on every replica'
complete -c drover -n "__fish_drover_using_subcommand operators; and not __fish_seen_subcommand_from list add rotate revoke help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c drover -n "__fish_drover_using_subcommand operators; and __fish_seen_subcommand_from list" -s o -l output -r -f -a "table\t''
wide\t'The table with more columns (devices: OS, architecture, transport, time zone, boot id)'
json\t''
yaml\t''
name\t'`kind/name` per object, one per line (for scripts)'"
complete -c drover -n "__fish_drover_using_subcommand operators; and __fish_seen_subcommand_from list" -l server -d 'The control plane\'s API (default: the context\'s, else http://127.0.0.1:7180)' -r
complete -c drover -n "__fish_drover_using_subcommand operators; and __fish_seen_subcommand_from list" -l ca-file -d 'For an https:// server: the CA bundle to trust, or the server\'s own self-signed certificate (default: the context\'s, else the system\'s CAs)' -r -F
complete -c drover -n "__fish_drover_using_subcommand operators; and __fish_seen_subcommand_from list" -l token -d 'The operator token (default: the context\'s token file, else DATA/operator.token)' -r
complete -c drover -n "__fish_drover_using_subcommand operators; and __fish_seen_subcommand_from list" -l context -d 'The context to use from the CLI\'s config (~/.config/drover/config.toml, or DROVER_CONFIG); default: the current one (`drover config use-context`)' -r
complete -c drover -n "__fish_drover_using_subcommand operators; and __fish_seen_subcommand_from list" -l data -d 'The control plane\'s data directory' -r -F
complete -c drover -n "__fish_drover_using_subcommand operators; and __fish_seen_subcommand_from list" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c drover -n "__fish_drover_using_subcommand operators; and __fish_seen_subcommand_from add" -l role -d 'viewer: reads; operator: also applies, cancels, uploads; admin: also deletes and manages operators and devices\' tokens' -r
complete -c drover -n "__fish_drover_using_subcommand operators; and __fish_seen_subcommand_from add" -l server -d 'The control plane\'s API (default: the context\'s, else http://127.0.0.1:7180)' -r
complete -c drover -n "__fish_drover_using_subcommand operators; and __fish_seen_subcommand_from add" -l ca-file -d 'For an https:// server: the CA bundle to trust, or the server\'s own self-signed certificate (default: the context\'s, else the system\'s CAs)' -r -F
complete -c drover -n "__fish_drover_using_subcommand operators; and __fish_seen_subcommand_from add" -l token -d 'The operator token (default: the context\'s token file, else DATA/operator.token)' -r
complete -c drover -n "__fish_drover_using_subcommand operators; and __fish_seen_subcommand_from add" -l context -d 'The context to use from the CLI\'s config (~/.config/drover/config.toml, or DROVER_CONFIG); default: the current one (`drover config use-context`)' -r
complete -c drover -n "__fish_drover_using_subcommand operators; and __fish_seen_subcommand_from add" -l data -d 'The control plane\'s data directory' -r -F
complete -c drover -n "__fish_drover_using_subcommand operators; and __fish_seen_subcommand_from add" -s h -l help -d 'Print help'
complete -c drover -n "__fish_drover_using_subcommand operators; and __fish_seen_subcommand_from rotate" -l server -d 'The control plane\'s API (default: the context\'s, else http://127.0.0.1:7180)' -r
complete -c drover -n "__fish_drover_using_subcommand operators; and __fish_seen_subcommand_from rotate" -l ca-file -d 'For an https:// server: the CA bundle to trust, or the server\'s own self-signed certificate (default: the context\'s, else the system\'s CAs)' -r -F
complete -c drover -n "__fish_drover_using_subcommand operators; and __fish_seen_subcommand_from rotate" -l token -d 'The operator token (default: the context\'s token file, else DATA/operator.token)' -r
complete -c drover -n "__fish_drover_using_subcommand operators; and __fish_seen_subcommand_from rotate" -l context -d 'The context to use from the CLI\'s config (~/.config/drover/config.toml, or DROVER_CONFIG); default: the current one (`drover config use-context`)' -r
complete -c drover -n "__fish_drover_using_subcommand operators; and __fish_seen_subcommand_from rotate" -l data -d 'The control plane\'s data directory' -r -F
complete -c drover -n "__fish_drover_using_subcommand operators; and __fish_seen_subcommand_from rotate" -s h -l help -d 'Print help'
complete -c drover -n "__fish_drover_using_subcommand operators; and __fish_seen_subcommand_from revoke" -l server -d 'The control plane\'s API (default: the context\'s, else http://127.0.0.1:7180)' -r
complete -c drover -n "__fish_drover_using_subcommand operators; and __fish_seen_subcommand_from revoke" -l ca-file -d 'For an https:// server: the CA bundle to trust, or the server\'s own self-signed certificate (default: the context\'s, else the system\'s CAs)' -r -F
complete -c drover -n "__fish_drover_using_subcommand operators; and __fish_seen_subcommand_from revoke" -l token -d 'The operator token (default: the context\'s token file, else DATA/operator.token)' -r
complete -c drover -n "__fish_drover_using_subcommand operators; and __fish_seen_subcommand_from revoke" -l context -d 'The context to use from the CLI\'s config (~/.config/drover/config.toml, or DROVER_CONFIG); default: the current one (`drover config use-context`)' -r
complete -c drover -n "__fish_drover_using_subcommand operators; and __fish_seen_subcommand_from revoke" -l data -d 'The control plane\'s data directory' -r -F
complete -c drover -n "__fish_drover_using_subcommand operators; and __fish_seen_subcommand_from revoke" -s h -l help -d 'Print help'
complete -c drover -n "__fish_drover_using_subcommand operators; and __fish_seen_subcommand_from help" -f -a "list" -d 'Every operator, its role and whether it is revoked'
complete -c drover -n "__fish_drover_using_subcommand operators; and __fish_seen_subcommand_from help" -f -a "add" -d 'Add an operator and print its token (shown once, stored as a digest)'
complete -c drover -n "__fish_drover_using_subcommand operators; and __fish_seen_subcommand_from help" -f -a "rotate" -d 'Give an operator a new token; the old one and its dashboard sessions stop working at once'
complete -c drover -n "__fish_drover_using_subcommand operators; and __fish_seen_subcommand_from help" -f -a "revoke" -d 'Revoke an operator: its token and dashboard sessions are refused on every replica'
complete -c drover -n "__fish_drover_using_subcommand operators; and __fish_seen_subcommand_from help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c drover -n "__fish_drover_using_subcommand enrollment-tokens; and not __fish_seen_subcommand_from list create revoke help" -l server -d 'The control plane\'s API (default: the context\'s, else http://127.0.0.1:7180)' -r
complete -c drover -n "__fish_drover_using_subcommand enrollment-tokens; and not __fish_seen_subcommand_from list create revoke help" -l ca-file -d 'For an https:// server: the CA bundle to trust, or the server\'s own self-signed certificate (default: the context\'s, else the system\'s CAs)' -r -F
complete -c drover -n "__fish_drover_using_subcommand enrollment-tokens; and not __fish_seen_subcommand_from list create revoke help" -l token -d 'The operator token (default: the context\'s token file, else DATA/operator.token)' -r
complete -c drover -n "__fish_drover_using_subcommand enrollment-tokens; and not __fish_seen_subcommand_from list create revoke help" -l context -d 'The context to use from the CLI\'s config (~/.config/drover/config.toml, or DROVER_CONFIG); default: the current one (`drover config use-context`)' -r
complete -c drover -n "__fish_drover_using_subcommand enrollment-tokens; and not __fish_seen_subcommand_from list create revoke help" -l data -d 'The control plane\'s data directory' -r -F
complete -c drover -n "__fish_drover_using_subcommand enrollment-tokens; and not __fish_seen_subcommand_from list create revoke help" -s h -l help -d 'Print help'
complete -c drover -n "__fish_drover_using_subcommand enrollment-tokens; and not __fish_seen_subcommand_from list create revoke help" -f -a "list" -d 'Every enrollment token: its groups, labels, uses and state'
complete -c drover -n "__fish_drover_using_subcommand enrollment-tokens; and not __fish_seen_subcommand_from list create revoke help" -f -a "create" -d 'Make a token and print it (shown once, stored as a digest): put it in the devices\' enrollment file'
complete -c drover -n "__fish_drover_using_subcommand enrollment-tokens; and not __fish_seen_subcommand_from list create revoke help" -f -a "revoke" -d 'Revoke a token: devices that enrolled with it stay; no new one can'
complete -c drover -n "__fish_drover_using_subcommand enrollment-tokens; and not __fish_seen_subcommand_from list create revoke help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c drover -n "__fish_drover_using_subcommand enrollment-tokens; and __fish_seen_subcommand_from list" -s o -l output -r -f -a "table\t''
wide\t'The table with more columns (devices: OS, architecture, transport, time zone, boot id)'
json\t''
yaml\t''
name\t'`kind/name` per object, one per line (for scripts)'"
complete -c drover -n "__fish_drover_using_subcommand enrollment-tokens; and __fish_seen_subcommand_from list" -l server -d 'The control plane\'s API (default: the context\'s, else http://127.0.0.1:7180)' -r
complete -c drover -n "__fish_drover_using_subcommand enrollment-tokens; and __fish_seen_subcommand_from list" -l ca-file -d 'For an https:// server: the CA bundle to trust, or the server\'s own self-signed certificate (default: the context\'s, else the system\'s CAs)' -r -F
complete -c drover -n "__fish_drover_using_subcommand enrollment-tokens; and __fish_seen_subcommand_from list" -l token -d 'The operator token (default: the context\'s token file, else DATA/operator.token)' -r
complete -c drover -n "__fish_drover_using_subcommand enrollment-tokens; and __fish_seen_subcommand_from list" -l context -d 'The context to use from the CLI\'s config (~/.config/drover/config.toml, or DROVER_CONFIG); default: the current one (`drover config use-context`)' -r
complete -c drover -n "__fish_drover_using_subcommand enrollment-tokens; and __fish_seen_subcommand_from list" -l data -d 'The control plane\'s data directory' -r -F
complete -c drover -n "__fish_drover_using_subcommand enrollment-tokens; and __fish_seen_subcommand_from list" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c drover -n "__fish_drover_using_subcommand enrollment-tokens; and __fish_seen_subcommand_from create" -l groups -d 'Groups a device accepted through it joins (comma-separated or repeated)' -r
complete -c drover -n "__fish_drover_using_subcommand enrollment-tokens; and __fish_seen_subcommand_from create" -l labels -d 'Labels it gets, KEY=VALUE (comma-separated or repeated)' -r
complete -c drover -n "__fish_drover_using_subcommand enrollment-tokens; and __fish_seen_subcommand_from create" -l max-uses -d 'Devices it may enroll; without it, any number' -r
complete -c drover -n "__fish_drover_using_subcommand enrollment-tokens; and __fish_seen_subcommand_from create" -l expires -d 'When it stops enrolling: an age from now (30m, 24h, 7d) or a time (2026-12-31T00:00:00Z); without it, never' -r
complete -c drover -n "__fish_drover_using_subcommand enrollment-tokens; and __fish_seen_subcommand_from create" -l agent-config -d 'Print, instead of the token alone, the whole agent config of the devices enrolled with it, for /etc/drover/agent.toml: the address agents connect to (wss://HOST:7181, the agents\' port; mqtts://HOST:8883, the MQTT broker; tls://HOST:4222, NATS), the token, the CA and the keys intents are signed with' -r
complete -c drover -n "__fish_drover_using_subcommand enrollment-tokens; and __fish_seen_subcommand_from create" -l device-id -d 'With --agent-config: the device id, or a template each device fills in: {serial} (the device tree\'s serial number), {machine-id}, {hostname} [default: {machine-id}]' -r
complete -c drover -n "__fish_drover_using_subcommand enrollment-tokens; and __fish_seen_subcommand_from create" -l agent-ca-file -d 'With --agent-config: the CA the agents trust, put in the config [default: this command\'s --ca-file, the control plane\'s CA]' -r -F
complete -c drover -n "__fish_drover_using_subcommand enrollment-tokens; and __fish_seen_subcommand_from create" -l mode -d 'With --agent-config: "upgrade" (apt full-upgrade) or "simulate" (apt-get -s, changes nothing) [default: upgrade]' -r -f -a "upgrade\t''
simulate\t''"
complete -c drover -n "__fish_drover_using_subcommand enrollment-tokens; and __fish_seen_subcommand_from create" -l server -d 'The control plane\'s API (default: the context\'s, else http://127.0.0.1:7180)' -r
complete -c drover -n "__fish_drover_using_subcommand enrollment-tokens; and __fish_seen_subcommand_from create" -l ca-file -d 'For an https:// server: the CA bundle to trust, or the server\'s own self-signed certificate (default: the context\'s, else the system\'s CAs)' -r -F
complete -c drover -n "__fish_drover_using_subcommand enrollment-tokens; and __fish_seen_subcommand_from create" -l token -d 'The operator token (default: the context\'s token file, else DATA/operator.token)' -r
complete -c drover -n "__fish_drover_using_subcommand enrollment-tokens; and __fish_seen_subcommand_from create" -l context -d 'The context to use from the CLI\'s config (~/.config/drover/config.toml, or DROVER_CONFIG); default: the current one (`drover config use-context`)' -r
complete -c drover -n "__fish_drover_using_subcommand enrollment-tokens; and __fish_seen_subcommand_from create" -l data -d 'The control plane\'s data directory' -r -F
complete -c drover -n "__fish_drover_using_subcommand enrollment-tokens; and __fish_seen_subcommand_from create" -l auto-accept -d 'Accept devices enrolled with it at once, without an operator'
complete -c drover -n "__fish_drover_using_subcommand enrollment-tokens; and __fish_seen_subcommand_from create" -s h -l help -d 'Print help'
complete -c drover -n "__fish_drover_using_subcommand enrollment-tokens; and __fish_seen_subcommand_from revoke" -l server -d 'The control plane\'s API (default: the context\'s, else http://127.0.0.1:7180)' -r
complete -c drover -n "__fish_drover_using_subcommand enrollment-tokens; and __fish_seen_subcommand_from revoke" -l ca-file -d 'For an https:// server: the CA bundle to trust, or the server\'s own self-signed certificate (default: the context\'s, else the system\'s CAs)' -r -F
complete -c drover -n "__fish_drover_using_subcommand enrollment-tokens; and __fish_seen_subcommand_from revoke" -l token -d 'The operator token (default: the context\'s token file, else DATA/operator.token)' -r
complete -c drover -n "__fish_drover_using_subcommand enrollment-tokens; and __fish_seen_subcommand_from revoke" -l context -d 'The context to use from the CLI\'s config (~/.config/drover/config.toml, or DROVER_CONFIG); default: the current one (`drover config use-context`)' -r
complete -c drover -n "__fish_drover_using_subcommand enrollment-tokens; and __fish_seen_subcommand_from revoke" -l data -d 'The control plane\'s data directory' -r -F
complete -c drover -n "__fish_drover_using_subcommand enrollment-tokens; and __fish_seen_subcommand_from revoke" -s h -l help -d 'Print help'
complete -c drover -n "__fish_drover_using_subcommand enrollment-tokens; and __fish_seen_subcommand_from help" -f -a "list" -d 'Every enrollment token: its groups, labels, uses and state'
complete -c drover -n "__fish_drover_using_subcommand enrollment-tokens; and __fish_seen_subcommand_from help" -f -a "create" -d 'Make a token and print it (shown once, stored as a digest): put it in the devices\' enrollment file'
complete -c drover -n "__fish_drover_using_subcommand enrollment-tokens; and __fish_seen_subcommand_from help" -f -a "revoke" -d 'Revoke a token: devices that enrolled with it stay; no new one can'
complete -c drover -n "__fish_drover_using_subcommand enrollment-tokens; and __fish_seen_subcommand_from help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c drover -n "__fish_drover_using_subcommand devices; and not __fish_seen_subcommand_from pending keys accept reject preauthorize help" -l server -d 'The control plane\'s API (default: the context\'s, else http://127.0.0.1:7180)' -r
complete -c drover -n "__fish_drover_using_subcommand devices; and not __fish_seen_subcommand_from pending keys accept reject preauthorize help" -l ca-file -d 'For an https:// server: the CA bundle to trust, or the server\'s own self-signed certificate (default: the context\'s, else the system\'s CAs)' -r -F
complete -c drover -n "__fish_drover_using_subcommand devices; and not __fish_seen_subcommand_from pending keys accept reject preauthorize help" -l token -d 'The operator token (default: the context\'s token file, else DATA/operator.token)' -r
complete -c drover -n "__fish_drover_using_subcommand devices; and not __fish_seen_subcommand_from pending keys accept reject preauthorize help" -l context -d 'The context to use from the CLI\'s config (~/.config/drover/config.toml, or DROVER_CONFIG); default: the current one (`drover config use-context`)' -r
complete -c drover -n "__fish_drover_using_subcommand devices; and not __fish_seen_subcommand_from pending keys accept reject preauthorize help" -l data -d 'The control plane\'s data directory' -r -F
complete -c drover -n "__fish_drover_using_subcommand devices; and not __fish_seen_subcommand_from pending keys accept reject preauthorize help" -s h -l help -d 'Print help'
complete -c drover -n "__fish_drover_using_subcommand devices; and not __fish_seen_subcommand_from pending keys accept reject preauthorize help" -f -a "pending" -d 'Devices that enrolled and wait for an operator'
complete -c drover -n "__fish_drover_using_subcommand devices; and not __fish_seen_subcommand_from pending keys accept reject preauthorize help" -f -a "keys" -d 'Every enrolled key: pending, accepted and rejected'
complete -c drover -n "__fish_drover_using_subcommand devices; and not __fish_seen_subcommand_from pending keys accept reject preauthorize help" -f -a "accept" -d 'Accept a pending device: it joins with its token\'s groups and labels'
complete -c drover -n "__fish_drover_using_subcommand devices; and not __fish_seen_subcommand_from pending keys accept reject preauthorize help" -f -a "reject" -d 'Reject a device\'s key: it opens nothing, asking again is refused, and an open session ends'
complete -c drover -n "__fish_drover_using_subcommand devices; and not __fish_seen_subcommand_from pending keys accept reject preauthorize help" -f -a "preauthorize" -d 'Accept a device\'s key before it asks (the key `drover-agent status` prints on the device): its agent is let in by the key at once'
complete -c drover -n "__fish_drover_using_subcommand devices; and not __fish_seen_subcommand_from pending keys accept reject preauthorize help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c drover -n "__fish_drover_using_subcommand devices; and __fish_seen_subcommand_from pending" -s o -l output -r -f -a "table\t''
wide\t'The table with more columns (devices: OS, architecture, transport, time zone, boot id)'
json\t''
yaml\t''
name\t'`kind/name` per object, one per line (for scripts)'"
complete -c drover -n "__fish_drover_using_subcommand devices; and __fish_seen_subcommand_from pending" -l server -d 'The control plane\'s API (default: the context\'s, else http://127.0.0.1:7180)' -r
complete -c drover -n "__fish_drover_using_subcommand devices; and __fish_seen_subcommand_from pending" -l ca-file -d 'For an https:// server: the CA bundle to trust, or the server\'s own self-signed certificate (default: the context\'s, else the system\'s CAs)' -r -F
complete -c drover -n "__fish_drover_using_subcommand devices; and __fish_seen_subcommand_from pending" -l token -d 'The operator token (default: the context\'s token file, else DATA/operator.token)' -r
complete -c drover -n "__fish_drover_using_subcommand devices; and __fish_seen_subcommand_from pending" -l context -d 'The context to use from the CLI\'s config (~/.config/drover/config.toml, or DROVER_CONFIG); default: the current one (`drover config use-context`)' -r
complete -c drover -n "__fish_drover_using_subcommand devices; and __fish_seen_subcommand_from pending" -l data -d 'The control plane\'s data directory' -r -F
complete -c drover -n "__fish_drover_using_subcommand devices; and __fish_seen_subcommand_from pending" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c drover -n "__fish_drover_using_subcommand devices; and __fish_seen_subcommand_from keys" -s o -l output -r -f -a "table\t''
wide\t'The table with more columns (devices: OS, architecture, transport, time zone, boot id)'
json\t''
yaml\t''
name\t'`kind/name` per object, one per line (for scripts)'"
complete -c drover -n "__fish_drover_using_subcommand devices; and __fish_seen_subcommand_from keys" -l server -d 'The control plane\'s API (default: the context\'s, else http://127.0.0.1:7180)' -r
complete -c drover -n "__fish_drover_using_subcommand devices; and __fish_seen_subcommand_from keys" -l ca-file -d 'For an https:// server: the CA bundle to trust, or the server\'s own self-signed certificate (default: the context\'s, else the system\'s CAs)' -r -F
complete -c drover -n "__fish_drover_using_subcommand devices; and __fish_seen_subcommand_from keys" -l token -d 'The operator token (default: the context\'s token file, else DATA/operator.token)' -r
complete -c drover -n "__fish_drover_using_subcommand devices; and __fish_seen_subcommand_from keys" -l context -d 'The context to use from the CLI\'s config (~/.config/drover/config.toml, or DROVER_CONFIG); default: the current one (`drover config use-context`)' -r
complete -c drover -n "__fish_drover_using_subcommand devices; and __fish_seen_subcommand_from keys" -l data -d 'The control plane\'s data directory' -r -F
complete -c drover -n "__fish_drover_using_subcommand devices; and __fish_seen_subcommand_from keys" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c drover -n "__fish_drover_using_subcommand devices; and __fish_seen_subcommand_from accept" -l server -d 'The control plane\'s API (default: the context\'s, else http://127.0.0.1:7180)' -r
complete -c drover -n "__fish_drover_using_subcommand devices; and __fish_seen_subcommand_from accept" -l ca-file -d 'For an https:// server: the CA bundle to trust, or the server\'s own self-signed certificate (default: the context\'s, else the system\'s CAs)' -r -F
complete -c drover -n "__fish_drover_using_subcommand devices; and __fish_seen_subcommand_from accept" -l token -d 'The operator token (default: the context\'s token file, else DATA/operator.token)' -r
complete -c drover -n "__fish_drover_using_subcommand devices; and __fish_seen_subcommand_from accept" -l context -d 'The context to use from the CLI\'s config (~/.config/drover/config.toml, or DROVER_CONFIG); default: the current one (`drover config use-context`)' -r
complete -c drover -n "__fish_drover_using_subcommand devices; and __fish_seen_subcommand_from accept" -l data -d 'The control plane\'s data directory' -r -F
complete -c drover -n "__fish_drover_using_subcommand devices; and __fish_seen_subcommand_from accept" -s h -l help -d 'Print help'
complete -c drover -n "__fish_drover_using_subcommand devices; and __fish_seen_subcommand_from reject" -l server -d 'The control plane\'s API (default: the context\'s, else http://127.0.0.1:7180)' -r
complete -c drover -n "__fish_drover_using_subcommand devices; and __fish_seen_subcommand_from reject" -l ca-file -d 'For an https:// server: the CA bundle to trust, or the server\'s own self-signed certificate (default: the context\'s, else the system\'s CAs)' -r -F
complete -c drover -n "__fish_drover_using_subcommand devices; and __fish_seen_subcommand_from reject" -l token -d 'The operator token (default: the context\'s token file, else DATA/operator.token)' -r
complete -c drover -n "__fish_drover_using_subcommand devices; and __fish_seen_subcommand_from reject" -l context -d 'The context to use from the CLI\'s config (~/.config/drover/config.toml, or DROVER_CONFIG); default: the current one (`drover config use-context`)' -r
complete -c drover -n "__fish_drover_using_subcommand devices; and __fish_seen_subcommand_from reject" -l data -d 'The control plane\'s data directory' -r -F
complete -c drover -n "__fish_drover_using_subcommand devices; and __fish_seen_subcommand_from reject" -s h -l help -d 'Print help'
complete -c drover -n "__fish_drover_using_subcommand devices; and __fish_seen_subcommand_from preauthorize" -l public-key -d 'The device\'s Ed25519 public key, 64 hex digits' -r
complete -c drover -n "__fish_drover_using_subcommand devices; and __fish_seen_subcommand_from preauthorize" -l groups -d 'Groups it joins (comma-separated or repeated)' -r
complete -c drover -n "__fish_drover_using_subcommand devices; and __fish_seen_subcommand_from preauthorize" -l labels -d 'Labels it gets, KEY=VALUE (comma-separated or repeated)' -r
complete -c drover -n "__fish_drover_using_subcommand devices; and __fish_seen_subcommand_from preauthorize" -l server -d 'The control plane\'s API (default: the context\'s, else http://127.0.0.1:7180)' -r
complete -c drover -n "__fish_drover_using_subcommand devices; and __fish_seen_subcommand_from preauthorize" -l ca-file -d 'For an https:// server: the CA bundle to trust, or the server\'s own self-signed certificate (default: the context\'s, else the system\'s CAs)' -r -F
complete -c drover -n "__fish_drover_using_subcommand devices; and __fish_seen_subcommand_from preauthorize" -l token -d 'The operator token (default: the context\'s token file, else DATA/operator.token)' -r
complete -c drover -n "__fish_drover_using_subcommand devices; and __fish_seen_subcommand_from preauthorize" -l context -d 'The context to use from the CLI\'s config (~/.config/drover/config.toml, or DROVER_CONFIG); default: the current one (`drover config use-context`)' -r
complete -c drover -n "__fish_drover_using_subcommand devices; and __fish_seen_subcommand_from preauthorize" -l data -d 'The control plane\'s data directory' -r -F
complete -c drover -n "__fish_drover_using_subcommand devices; and __fish_seen_subcommand_from preauthorize" -s h -l help -d 'Print help'
complete -c drover -n "__fish_drover_using_subcommand devices; and __fish_seen_subcommand_from help" -f -a "pending" -d 'Devices that enrolled and wait for an operator'
complete -c drover -n "__fish_drover_using_subcommand devices; and __fish_seen_subcommand_from help" -f -a "keys" -d 'Every enrolled key: pending, accepted and rejected'
complete -c drover -n "__fish_drover_using_subcommand devices; and __fish_seen_subcommand_from help" -f -a "accept" -d 'Accept a pending device: it joins with its token\'s groups and labels'
complete -c drover -n "__fish_drover_using_subcommand devices; and __fish_seen_subcommand_from help" -f -a "reject" -d 'Reject a device\'s key: it opens nothing, asking again is refused, and an open session ends'
complete -c drover -n "__fish_drover_using_subcommand devices; and __fish_seen_subcommand_from help" -f -a "preauthorize" -d 'Accept a device\'s key before it asks (the key `drover-agent status` prints on the device): its agent is let in by the key at once'
complete -c drover -n "__fish_drover_using_subcommand devices; and __fish_seen_subcommand_from help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c drover -n "__fish_drover_using_subcommand audit" -l since -d 'Only entries since this time (RFC 3339) or age (30m, 24h, 7d)' -r
complete -c drover -n "__fish_drover_using_subcommand audit" -l operator -d 'Only this operator\'s entries' -r
complete -c drover -n "__fish_drover_using_subcommand audit" -l kind -d 'Only entries about this kind (TaskRun, Deployment, Device, Operator, …)' -r
complete -c drover -n "__fish_drover_using_subcommand audit" -s o -l output -r -f -a "table\t''
wide\t'The table with more columns (devices: OS, architecture, transport, time zone, boot id)'
json\t''
yaml\t''
name\t'`kind/name` per object, one per line (for scripts)'"
complete -c drover -n "__fish_drover_using_subcommand audit" -l server -d 'The control plane\'s API (default: the context\'s, else http://127.0.0.1:7180)' -r
complete -c drover -n "__fish_drover_using_subcommand audit" -l ca-file -d 'For an https:// server: the CA bundle to trust, or the server\'s own self-signed certificate (default: the context\'s, else the system\'s CAs)' -r -F
complete -c drover -n "__fish_drover_using_subcommand audit" -l token -d 'The operator token (default: the context\'s token file, else DATA/operator.token)' -r
complete -c drover -n "__fish_drover_using_subcommand audit" -l context -d 'The context to use from the CLI\'s config (~/.config/drover/config.toml, or DROVER_CONFIG); default: the current one (`drover config use-context`)' -r
complete -c drover -n "__fish_drover_using_subcommand audit" -l data -d 'The control plane\'s data directory' -r -F
complete -c drover -n "__fish_drover_using_subcommand audit" -l jsonl -d 'One JSON object per line (for a SIEM)'
complete -c drover -n "__fish_drover_using_subcommand audit" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c drover -n "__fish_drover_using_subcommand packages; and not __fish_seen_subcommand_from upload help" -l server -d 'The control plane\'s API (default: the context\'s, else http://127.0.0.1:7180)' -r
complete -c drover -n "__fish_drover_using_subcommand packages; and not __fish_seen_subcommand_from upload help" -l ca-file -d 'For an https:// server: the CA bundle to trust, or the server\'s own self-signed certificate (default: the context\'s, else the system\'s CAs)' -r -F
complete -c drover -n "__fish_drover_using_subcommand packages; and not __fish_seen_subcommand_from upload help" -l token -d 'The operator token (default: the context\'s token file, else DATA/operator.token)' -r
complete -c drover -n "__fish_drover_using_subcommand packages; and not __fish_seen_subcommand_from upload help" -l context -d 'The context to use from the CLI\'s config (~/.config/drover/config.toml, or DROVER_CONFIG); default: the current one (`drover config use-context`)' -r
complete -c drover -n "__fish_drover_using_subcommand packages; and not __fish_seen_subcommand_from upload help" -l data -d 'The control plane\'s data directory' -r -F
complete -c drover -n "__fish_drover_using_subcommand packages; and not __fish_seen_subcommand_from upload help" -s h -l help -d 'Print help'
complete -c drover -n "__fish_drover_using_subcommand packages; and not __fish_seen_subcommand_from upload help" -f -a "upload" -d 'Store a .deb: its name, version and architecture are read from it, its size and SHA-256 recorded. The same file again changes nothing; another file under the same name, version and architecture is refused. The file is streamed with a progress bar at a terminal; an upload that keeps moving is never cut off, one that stops is sent again (3 attempts in all)'
complete -c drover -n "__fish_drover_using_subcommand packages; and not __fish_seen_subcommand_from upload help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c drover -n "__fish_drover_using_subcommand packages; and __fish_seen_subcommand_from upload" -l stall-seconds -d 'Give up on an attempt when the control plane takes no bytes for this many seconds' -r
complete -c drover -n "__fish_drover_using_subcommand packages; and __fish_seen_subcommand_from upload" -l server -d 'The control plane\'s API (default: the context\'s, else http://127.0.0.1:7180)' -r
complete -c drover -n "__fish_drover_using_subcommand packages; and __fish_seen_subcommand_from upload" -l ca-file -d 'For an https:// server: the CA bundle to trust, or the server\'s own self-signed certificate (default: the context\'s, else the system\'s CAs)' -r -F
complete -c drover -n "__fish_drover_using_subcommand packages; and __fish_seen_subcommand_from upload" -l token -d 'The operator token (default: the context\'s token file, else DATA/operator.token)' -r
complete -c drover -n "__fish_drover_using_subcommand packages; and __fish_seen_subcommand_from upload" -l context -d 'The context to use from the CLI\'s config (~/.config/drover/config.toml, or DROVER_CONFIG); default: the current one (`drover config use-context`)' -r
complete -c drover -n "__fish_drover_using_subcommand packages; and __fish_seen_subcommand_from upload" -l data -d 'The control plane\'s data directory' -r -F
complete -c drover -n "__fish_drover_using_subcommand packages; and __fish_seen_subcommand_from upload" -s h -l help -d 'Print help'
complete -c drover -n "__fish_drover_using_subcommand packages; and __fish_seen_subcommand_from help" -f -a "upload" -d 'Store a .deb: its name, version and architecture are read from it, its size and SHA-256 recorded. The same file again changes nothing; another file under the same name, version and architecture is refused. The file is streamed with a progress bar at a terminal; an upload that keeps moving is never cut off, one that stops is sent again (3 attempts in all)'
complete -c drover -n "__fish_drover_using_subcommand packages; and __fish_seen_subcommand_from help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c drover -n "__fish_drover_using_subcommand config; and not __fish_seen_subcommand_from set-context use-context get-contexts current-context delete-context help" -l server -d 'The control plane\'s API (default: the context\'s, else http://127.0.0.1:7180)' -r
complete -c drover -n "__fish_drover_using_subcommand config; and not __fish_seen_subcommand_from set-context use-context get-contexts current-context delete-context help" -l ca-file -d 'For an https:// server: the CA bundle to trust, or the server\'s own self-signed certificate (default: the context\'s, else the system\'s CAs)' -r -F
complete -c drover -n "__fish_drover_using_subcommand config; and not __fish_seen_subcommand_from set-context use-context get-contexts current-context delete-context help" -l token -d 'The operator token (default: the context\'s token file, else DATA/operator.token)' -r
complete -c drover -n "__fish_drover_using_subcommand config; and not __fish_seen_subcommand_from set-context use-context get-contexts current-context delete-context help" -l context -d 'The context to use from the CLI\'s config (~/.config/drover/config.toml, or DROVER_CONFIG); default: the current one (`drover config use-context`)' -r
complete -c drover -n "__fish_drover_using_subcommand config; and not __fish_seen_subcommand_from set-context use-context get-contexts current-context delete-context help" -l data -d 'The control plane\'s data directory' -r -F
complete -c drover -n "__fish_drover_using_subcommand config; and not __fish_seen_subcommand_from set-context use-context get-contexts current-context delete-context help" -s h -l help -d 'Print help'
complete -c drover -n "__fish_drover_using_subcommand config; and not __fish_seen_subcommand_from set-context use-context get-contexts current-context delete-context help" -f -a "set-context" -d 'Make or change a context: the API\'s address from --server, the CA to trust from --ca-file (init\'s tls/ca.pem), and the token file'
complete -c drover -n "__fish_drover_using_subcommand config; and not __fish_seen_subcommand_from set-context use-context get-contexts current-context delete-context help" -f -a "use-context" -d 'Make a context the current one'
complete -c drover -n "__fish_drover_using_subcommand config; and not __fish_seen_subcommand_from set-context use-context get-contexts current-context delete-context help" -f -a "get-contexts" -d 'List the contexts, the current one marked with *'
complete -c drover -n "__fish_drover_using_subcommand config; and not __fish_seen_subcommand_from set-context use-context get-contexts current-context delete-context help" -f -a "current-context" -d 'Print the current context\'s name'
complete -c drover -n "__fish_drover_using_subcommand config; and not __fish_seen_subcommand_from set-context use-context get-contexts current-context delete-context help" -f -a "delete-context" -d 'Remove a context'
complete -c drover -n "__fish_drover_using_subcommand config; and not __fish_seen_subcommand_from set-context use-context get-contexts current-context delete-context help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c drover -n "__fish_drover_using_subcommand config; and __fish_seen_subcommand_from set-context" -l token-file -d 'The file holding the operator token (mode 0600; the config keeps its path, not the token)' -r -F
complete -c drover -n "__fish_drover_using_subcommand config; and __fish_seen_subcommand_from set-context" -l server -d 'The control plane\'s API (default: the context\'s, else http://127.0.0.1:7180)' -r
complete -c drover -n "__fish_drover_using_subcommand config; and __fish_seen_subcommand_from set-context" -l ca-file -d 'For an https:// server: the CA bundle to trust, or the server\'s own self-signed certificate (default: the context\'s, else the system\'s CAs)' -r -F
complete -c drover -n "__fish_drover_using_subcommand config; and __fish_seen_subcommand_from set-context" -l token -d 'The operator token (default: the context\'s token file, else DATA/operator.token)' -r
complete -c drover -n "__fish_drover_using_subcommand config; and __fish_seen_subcommand_from set-context" -l context -d 'The context to use from the CLI\'s config (~/.config/drover/config.toml, or DROVER_CONFIG); default: the current one (`drover config use-context`)' -r
complete -c drover -n "__fish_drover_using_subcommand config; and __fish_seen_subcommand_from set-context" -l data -d 'The control plane\'s data directory' -r -F
complete -c drover -n "__fish_drover_using_subcommand config; and __fish_seen_subcommand_from set-context" -l use -d 'Make it the current context too'
complete -c drover -n "__fish_drover_using_subcommand config; and __fish_seen_subcommand_from set-context" -s h -l help -d 'Print help'
complete -c drover -n "__fish_drover_using_subcommand config; and __fish_seen_subcommand_from use-context" -l server -d 'The control plane\'s API (default: the context\'s, else http://127.0.0.1:7180)' -r
complete -c drover -n "__fish_drover_using_subcommand config; and __fish_seen_subcommand_from use-context" -l ca-file -d 'For an https:// server: the CA bundle to trust, or the server\'s own self-signed certificate (default: the context\'s, else the system\'s CAs)' -r -F
complete -c drover -n "__fish_drover_using_subcommand config; and __fish_seen_subcommand_from use-context" -l token -d 'The operator token (default: the context\'s token file, else DATA/operator.token)' -r
complete -c drover -n "__fish_drover_using_subcommand config; and __fish_seen_subcommand_from use-context" -l context -d 'The context to use from the CLI\'s config (~/.config/drover/config.toml, or DROVER_CONFIG); default: the current one (`drover config use-context`)' -r
complete -c drover -n "__fish_drover_using_subcommand config; and __fish_seen_subcommand_from use-context" -l data -d 'The control plane\'s data directory' -r -F
complete -c drover -n "__fish_drover_using_subcommand config; and __fish_seen_subcommand_from use-context" -s h -l help -d 'Print help'
complete -c drover -n "__fish_drover_using_subcommand config; and __fish_seen_subcommand_from get-contexts" -l server -d 'The control plane\'s API (default: the context\'s, else http://127.0.0.1:7180)' -r
complete -c drover -n "__fish_drover_using_subcommand config; and __fish_seen_subcommand_from get-contexts" -l ca-file -d 'For an https:// server: the CA bundle to trust, or the server\'s own self-signed certificate (default: the context\'s, else the system\'s CAs)' -r -F
complete -c drover -n "__fish_drover_using_subcommand config; and __fish_seen_subcommand_from get-contexts" -l token -d 'The operator token (default: the context\'s token file, else DATA/operator.token)' -r
complete -c drover -n "__fish_drover_using_subcommand config; and __fish_seen_subcommand_from get-contexts" -l context -d 'The context to use from the CLI\'s config (~/.config/drover/config.toml, or DROVER_CONFIG); default: the current one (`drover config use-context`)' -r
complete -c drover -n "__fish_drover_using_subcommand config; and __fish_seen_subcommand_from get-contexts" -l data -d 'The control plane\'s data directory' -r -F
complete -c drover -n "__fish_drover_using_subcommand config; and __fish_seen_subcommand_from get-contexts" -s h -l help -d 'Print help'
complete -c drover -n "__fish_drover_using_subcommand config; and __fish_seen_subcommand_from current-context" -l server -d 'The control plane\'s API (default: the context\'s, else http://127.0.0.1:7180)' -r
complete -c drover -n "__fish_drover_using_subcommand config; and __fish_seen_subcommand_from current-context" -l ca-file -d 'For an https:// server: the CA bundle to trust, or the server\'s own self-signed certificate (default: the context\'s, else the system\'s CAs)' -r -F
complete -c drover -n "__fish_drover_using_subcommand config; and __fish_seen_subcommand_from current-context" -l token -d 'The operator token (default: the context\'s token file, else DATA/operator.token)' -r
complete -c drover -n "__fish_drover_using_subcommand config; and __fish_seen_subcommand_from current-context" -l context -d 'The context to use from the CLI\'s config (~/.config/drover/config.toml, or DROVER_CONFIG); default: the current one (`drover config use-context`)' -r
complete -c drover -n "__fish_drover_using_subcommand config; and __fish_seen_subcommand_from current-context" -l data -d 'The control plane\'s data directory' -r -F
complete -c drover -n "__fish_drover_using_subcommand config; and __fish_seen_subcommand_from current-context" -s h -l help -d 'Print help'
complete -c drover -n "__fish_drover_using_subcommand config; and __fish_seen_subcommand_from delete-context" -l server -d 'The control plane\'s API (default: the context\'s, else http://127.0.0.1:7180)' -r
complete -c drover -n "__fish_drover_using_subcommand config; and __fish_seen_subcommand_from delete-context" -l ca-file -d 'For an https:// server: the CA bundle to trust, or the server\'s own self-signed certificate (default: the context\'s, else the system\'s CAs)' -r -F
complete -c drover -n "__fish_drover_using_subcommand config; and __fish_seen_subcommand_from delete-context" -l token -d 'The operator token (default: the context\'s token file, else DATA/operator.token)' -r
complete -c drover -n "__fish_drover_using_subcommand config; and __fish_seen_subcommand_from delete-context" -l context -d 'The context to use from the CLI\'s config (~/.config/drover/config.toml, or DROVER_CONFIG); default: the current one (`drover config use-context`)' -r
complete -c drover -n "__fish_drover_using_subcommand config; and __fish_seen_subcommand_from delete-context" -l data -d 'The control plane\'s data directory' -r -F
complete -c drover -n "__fish_drover_using_subcommand config; and __fish_seen_subcommand_from delete-context" -s h -l help -d 'Print help'
complete -c drover -n "__fish_drover_using_subcommand config; and __fish_seen_subcommand_from help" -f -a "set-context" -d 'Make or change a context: the API\'s address from --server, the CA to trust from --ca-file (init\'s tls/ca.pem), and the token file'
complete -c drover -n "__fish_drover_using_subcommand config; and __fish_seen_subcommand_from help" -f -a "use-context" -d 'Make a context the current one'
complete -c drover -n "__fish_drover_using_subcommand config; and __fish_seen_subcommand_from help" -f -a "get-contexts" -d 'List the contexts, the current one marked with *'
complete -c drover -n "__fish_drover_using_subcommand config; and __fish_seen_subcommand_from help" -f -a "current-context" -d 'Print the current context\'s name'
complete -c drover -n "__fish_drover_using_subcommand config; and __fish_seen_subcommand_from help" -f -a "delete-context" -d 'Remove a context'
complete -c drover -n "__fish_drover_using_subcommand config; and __fish_seen_subcommand_from help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c drover -n "__fish_drover_using_subcommand token" -l server -d 'The control plane\'s API (default: the context\'s, else http://127.0.0.1:7180)' -r
complete -c drover -n "__fish_drover_using_subcommand token" -l ca-file -d 'For an https:// server: the CA bundle to trust, or the server\'s own self-signed certificate (default: the context\'s, else the system\'s CAs)' -r -F
complete -c drover -n "__fish_drover_using_subcommand token" -l token -d 'The operator token (default: the context\'s token file, else DATA/operator.token)' -r
complete -c drover -n "__fish_drover_using_subcommand token" -l context -d 'The context to use from the CLI\'s config (~/.config/drover/config.toml, or DROVER_CONFIG); default: the current one (`drover config use-context`)' -r
complete -c drover -n "__fish_drover_using_subcommand token" -l data -d 'The control plane\'s data directory' -r -F
complete -c drover -n "__fish_drover_using_subcommand token" -l unregistered -d 'Print it for a device that is not registered (yet), without asking the API (a token never rotated)'
complete -c drover -n "__fish_drover_using_subcommand token" -l rotate -d 'Revoke the device\'s token and print the next one (an admin\'s): the old one is refused from now on and its WebSocket session ends. Over MQTT or NATS, make the broker\'s files again'
complete -c drover -n "__fish_drover_using_subcommand token" -s h -l help -d 'Print help'
complete -c drover -n "__fish_drover_using_subcommand reset-store" -l server -d 'The control plane\'s API (default: the context\'s, else http://127.0.0.1:7180)' -r
complete -c drover -n "__fish_drover_using_subcommand reset-store" -l ca-file -d 'For an https:// server: the CA bundle to trust, or the server\'s own self-signed certificate (default: the context\'s, else the system\'s CAs)' -r -F
complete -c drover -n "__fish_drover_using_subcommand reset-store" -l token -d 'The operator token (default: the context\'s token file, else DATA/operator.token)' -r
complete -c drover -n "__fish_drover_using_subcommand reset-store" -l context -d 'The context to use from the CLI\'s config (~/.config/drover/config.toml, or DROVER_CONFIG); default: the current one (`drover config use-context`)' -r
complete -c drover -n "__fish_drover_using_subcommand reset-store" -l data -d 'The control plane\'s data directory' -r -F
complete -c drover -n "__fish_drover_using_subcommand reset-store" -l yes -d 'Do not ask: the database is moved aside (for scripts)'
complete -c drover -n "__fish_drover_using_subcommand reset-store" -s h -l help -d 'Print help'
complete -c drover -n "__fish_drover_using_subcommand verify-store" -l server -d 'The control plane\'s API (default: the context\'s, else http://127.0.0.1:7180)' -r
complete -c drover -n "__fish_drover_using_subcommand verify-store" -l ca-file -d 'For an https:// server: the CA bundle to trust, or the server\'s own self-signed certificate (default: the context\'s, else the system\'s CAs)' -r -F
complete -c drover -n "__fish_drover_using_subcommand verify-store" -l token -d 'The operator token (default: the context\'s token file, else DATA/operator.token)' -r
complete -c drover -n "__fish_drover_using_subcommand verify-store" -l context -d 'The context to use from the CLI\'s config (~/.config/drover/config.toml, or DROVER_CONFIG); default: the current one (`drover config use-context`)' -r
complete -c drover -n "__fish_drover_using_subcommand verify-store" -l data -d 'The control plane\'s data directory' -r -F
complete -c drover -n "__fish_drover_using_subcommand verify-store" -s h -l help -d 'Print help'
complete -c drover -n "__fish_drover_using_subcommand intent-key" -l server -d 'The control plane\'s API (default: the context\'s, else http://127.0.0.1:7180)' -r
complete -c drover -n "__fish_drover_using_subcommand intent-key" -l ca-file -d 'For an https:// server: the CA bundle to trust, or the server\'s own self-signed certificate (default: the context\'s, else the system\'s CAs)' -r -F
complete -c drover -n "__fish_drover_using_subcommand intent-key" -l token -d 'The operator token (default: the context\'s token file, else DATA/operator.token)' -r
complete -c drover -n "__fish_drover_using_subcommand intent-key" -l context -d 'The context to use from the CLI\'s config (~/.config/drover/config.toml, or DROVER_CONFIG); default: the current one (`drover config use-context`)' -r
complete -c drover -n "__fish_drover_using_subcommand intent-key" -l data -d 'The control plane\'s data directory' -r -F
complete -c drover -n "__fish_drover_using_subcommand intent-key" -s h -l help -d 'Print help'
complete -c drover -n "__fish_drover_using_subcommand init" -l tls-name -d 'A DNS name or IP address agents and operators use to reach the control plane (repeat for each)' -r
complete -c drover -n "__fish_drover_using_subcommand init" -l server -d 'The control plane\'s API (default: the context\'s, else http://127.0.0.1:7180)' -r
complete -c drover -n "__fish_drover_using_subcommand init" -l ca-file -d 'For an https:// server: the CA bundle to trust, or the server\'s own self-signed certificate (default: the context\'s, else the system\'s CAs)' -r -F
complete -c drover -n "__fish_drover_using_subcommand init" -l token -d 'The operator token (default: the context\'s token file, else DATA/operator.token)' -r
complete -c drover -n "__fish_drover_using_subcommand init" -l context -d 'The context to use from the CLI\'s config (~/.config/drover/config.toml, or DROVER_CONFIG); default: the current one (`drover config use-context`)' -r
complete -c drover -n "__fish_drover_using_subcommand init" -l data -d 'The control plane\'s data directory' -r -F
complete -c drover -n "__fish_drover_using_subcommand init" -l renew-tls -d 'Replace an existing CA and server certificate (asks first unless --yes)'
complete -c drover -n "__fish_drover_using_subcommand init" -l yes -d 'Do not ask before --renew-tls replaces the CA (for scripts)'
complete -c drover -n "__fish_drover_using_subcommand init" -s h -l help -d 'Print help'
complete -c drover -n "__fish_drover_using_subcommand demo" -l agents -r
complete -c drover -n "__fish_drover_using_subcommand demo" -l agent-bin -d 'The drover-agent binary (default: next to drover, or on PATH)' -r -F
complete -c drover -n "__fish_drover_using_subcommand demo" -l server -d 'The control plane\'s API (default: the context\'s, else http://127.0.0.1:7180)' -r
complete -c drover -n "__fish_drover_using_subcommand demo" -l ca-file -d 'For an https:// server: the CA bundle to trust, or the server\'s own self-signed certificate (default: the context\'s, else the system\'s CAs)' -r -F
complete -c drover -n "__fish_drover_using_subcommand demo" -l token -d 'The operator token (default: the context\'s token file, else DATA/operator.token)' -r
complete -c drover -n "__fish_drover_using_subcommand demo" -l context -d 'The context to use from the CLI\'s config (~/.config/drover/config.toml, or DROVER_CONFIG); default: the current one (`drover config use-context`)' -r
complete -c drover -n "__fish_drover_using_subcommand demo" -l data -d 'The control plane\'s data directory' -r -F
complete -c drover -n "__fish_drover_using_subcommand demo" -l keep -d 'Keep the demo\'s temporary directory'
complete -c drover -n "__fish_drover_using_subcommand demo" -l upgrade -d 'Run the real apt upgrade, each agent in its own disposable Debian root (needs root and debootstrap), instead of simulating it'
complete -c drover -n "__fish_drover_using_subcommand demo" -s h -l help -d 'Print help'
complete -c drover -n "__fish_drover_using_subcommand help; and not __fish_seen_subcommand_from serve nats-config mqtt-config apply get runs describe logs patch-status cancel delete deployments alerts operators enrollment-tokens devices audit packages config token reset-store verify-store intent-key init demo help" -f -a "serve" -d 'Run the control plane: the embedded store in --data by default, or NATS JetStream (--store nats) for several replicas'
complete -c drover -n "__fish_drover_using_subcommand help; and not __fish_seen_subcommand_from serve nats-config mqtt-config apply get runs describe logs patch-status cancel delete deployments alerts operators enrollment-tokens devices audit packages config token reset-store verify-store intent-key init demo help" -f -a "nats-config" -d 'Print a nats-server authorization block: the control plane may do anything; each device may read only its own intents and send only its own statuses, hello and heartbeat to the control plane, and may write no bucket (its password is derived from its device token and written as a bcrypt hash)'
complete -c drover -n "__fish_drover_using_subcommand help; and not __fish_seen_subcommand_from serve nats-config mqtt-config apply get runs describe logs patch-status cancel delete deployments alerts operators enrollment-tokens devices audit packages config token reset-store verify-store intent-key init demo help" -f -a "mqtt-config" -d 'Write mosquitto\'s password and ACL files for the control plane and these devices (a device may read only its own intents and write only its own status, hello and heartbeat; its password is derived from its token), and print the mosquitto.conf lines that use them. Run it on the control plane\'s host with its --data'
complete -c drover -n "__fish_drover_using_subcommand help; and not __fish_seen_subcommand_from serve nats-config mqtt-config apply get runs describe logs patch-status cancel delete deployments alerts operators enrollment-tokens devices audit packages config token reset-store verify-store intent-key init demo help" -f -a "apply" -d 'Create or configure resources from a YAML or JSON file'
complete -c drover -n "__fish_drover_using_subcommand help; and not __fish_seen_subcommand_from serve nats-config mqtt-config apply get runs describe logs patch-status cancel delete deployments alerts operators enrollment-tokens devices audit packages config token reset-store verify-store intent-key init demo help" -f -a "get" -d 'Show devices, taskruns, taskschedules, deployments or packages: all of a kind, or with NAME that one (exit 1 when there is none). Each kind goes by its plural, its singular or a short name (dev, tr, ts, deploy, pkg)'
complete -c drover -n "__fish_drover_using_subcommand help; and not __fish_seen_subcommand_from serve nats-config mqtt-config apply get runs describe logs patch-status cancel delete deployments alerts operators enrollment-tokens devices audit packages config token reset-store verify-store intent-key init demo help" -f -a "runs" -d 'Follow task runs and deployments'
complete -c drover -n "__fish_drover_using_subcommand help; and not __fish_seen_subcommand_from serve nats-config mqtt-config apply get runs describe logs patch-status cancel delete deployments alerts operators enrollment-tokens devices audit packages config token reset-store verify-store intent-key init demo help" -f -a "describe" -d 'Show one resource in detail: a deployment\'s counts, each site\'s window now, its latest errors and the retries waiting'
complete -c drover -n "__fish_drover_using_subcommand help; and not __fish_seen_subcommand_from serve nats-config mqtt-config apply get runs describe logs patch-status cancel delete deployments alerts operators enrollment-tokens devices audit packages config token reset-store verify-store intent-key init demo help" -f -a "logs" -d 'A job\'s whole output, fetched from the device through its transport as it answers: each apt and dpkg call with its command and exit status, then what it printed (apt\'s and dpkg\'s own words, the maintainer scripts\'). The device keeps its jobs\' output for 30 days and 32 MiB; at most the last 4 MiB of one job come back'
complete -c drover -n "__fish_drover_using_subcommand help; and not __fish_seen_subcommand_from serve nats-config mqtt-config apply get runs describe logs patch-status cancel delete deployments alerts operators enrollment-tokens devices audit packages config token reset-store verify-store intent-key init demo help" -f -a "patch-status" -d 'The fleet\'s patch status from each device\'s latest assessment: up to date, with updates or security updates pending (and how long the oldest has waited), a reboot pending, not assessed lately'
complete -c drover -n "__fish_drover_using_subcommand help; and not __fish_seen_subcommand_from serve nats-config mqtt-config apply get runs describe logs patch-status cancel delete deployments alerts operators enrollment-tokens devices audit packages config token reset-store verify-store intent-key init demo help" -f -a "cancel" -d 'Cancel a task run or a deployment: nothing more is released, jobs that have not started on their devices are canceled there, and jobs that have started run to their end (an upgrade is never cut short). It ends Failed with reason Canceled once every job is decided; `drover runs watch NAME` follows it'
complete -c drover -n "__fish_drover_using_subcommand help; and not __fish_seen_subcommand_from serve nats-config mqtt-config apply get runs describe logs patch-status cancel delete deployments alerts operators enrollment-tokens devices audit packages config token reset-store verify-store intent-key init demo help" -f -a "delete" -d 'Delete a finished task run or deployment (its record, targets and jobs), a device (its registry record, inventory and finished jobs), a task schedule, a Secret or a package. What is still going is refused with the command to run first: cancel a run or a deployment; a Secret or a package an unfinished deployment needs stays'
complete -c drover -n "__fish_drover_using_subcommand help; and not __fish_seen_subcommand_from serve nats-config mqtt-config apply get runs describe logs patch-status cancel delete deployments alerts operators enrollment-tokens devices audit packages config token reset-store verify-store intent-key init demo help" -f -a "deployments" -d 'Act on deployments'
complete -c drover -n "__fish_drover_using_subcommand help; and not __fish_seen_subcommand_from serve nats-config mqtt-config apply get runs describe logs patch-status cancel delete deployments alerts operators enrollment-tokens devices audit packages config token reset-store verify-store intent-key init demo help" -f -a "alerts" -d 'What needs an operator\'s eye: failed canaries and deployments, runs past their deadline, devices offline, in a resume loop, with a security update waiting, a reboot pending or no recent assessment. Each says whether, by whom and when it was acknowledged'
complete -c drover -n "__fish_drover_using_subcommand help; and not __fish_seen_subcommand_from serve nats-config mqtt-config apply get runs describe logs patch-status cancel delete deployments alerts operators enrollment-tokens devices audit packages config token reset-store verify-store intent-key init demo help" -f -a "operators" -d 'Named operators, each with a role (viewer, operator, admin) and its own token: add, list, rotate, revoke. The bootstrap token (DATA/operator.token) is the admin named `admin`'
complete -c drover -n "__fish_drover_using_subcommand help; and not __fish_seen_subcommand_from serve nats-config mqtt-config apply get runs describe logs patch-status cancel delete deployments alerts operators enrollment-tokens devices audit packages config token reset-store verify-store intent-key init demo help" -f -a "enrollment-tokens" -d 'Enrollment tokens: one in a device image lets every device made from it ask to join (create, list, revoke)'
complete -c drover -n "__fish_drover_using_subcommand help; and not __fish_seen_subcommand_from serve nats-config mqtt-config apply get runs describe logs patch-status cancel delete deployments alerts operators enrollment-tokens devices audit packages config token reset-store verify-store intent-key init demo help" -f -a "devices" -d 'Devices that enrolled their own key: pending, accept, reject'
complete -c drover -n "__fish_drover_using_subcommand help; and not __fish_seen_subcommand_from serve nats-config mqtt-config apply get runs describe logs patch-status cancel delete deployments alerts operators enrollment-tokens devices audit packages config token reset-store verify-store intent-key init demo help" -f -a "audit" -d 'The audit log: every change (who, what, when, from where, the outcome) and every refused request, oldest first'
complete -c drover -n "__fish_drover_using_subcommand help; and not __fish_seen_subcommand_from serve nats-config mqtt-config apply get runs describe logs patch-status cancel delete deployments alerts operators enrollment-tokens devices audit packages config token reset-store verify-store intent-key init demo help" -f -a "packages" -d 'The package store (for packageInstallV1 deployments)'
complete -c drover -n "__fish_drover_using_subcommand help; and not __fish_seen_subcommand_from serve nats-config mqtt-config apply get runs describe logs patch-status cancel delete deployments alerts operators enrollment-tokens devices audit packages config token reset-store verify-store intent-key init demo help" -f -a "config" -d 'The CLI\'s contexts: control planes by name, each with its server, CA and token file (kept in ~/.config/drover/config.toml, or DROVER_CONFIG; the token stays in its file)'
complete -c drover -n "__fish_drover_using_subcommand help; and not __fish_seen_subcommand_from serve nats-config mqtt-config apply get runs describe logs patch-status cancel delete deployments alerts operators enrollment-tokens devices audit packages config token reset-store verify-store intent-key init demo help" -f -a "token" -d 'Print the bearer token a device\'s agent uses. Refused for a device the control plane does not know (it asks the API), unless --unregistered'
complete -c drover -n "__fish_drover_using_subcommand help; and not __fish_seen_subcommand_from serve nats-config mqtt-config apply get runs describe logs patch-status cancel delete deployments alerts operators enrollment-tokens devices audit packages config token reset-store verify-store intent-key init demo help" -f -a "reset-store" -d 'Move a damaged or empty control-plane database aside (DATA/drover.redb); the next `serve` starts with a new, empty one. Refused while a `serve` holds the database; asks first unless --yes'
complete -c drover -n "__fish_drover_using_subcommand help; and not __fish_seen_subcommand_from serve nats-config mqtt-config apply get runs describe logs patch-status cancel delete deployments alerts operators enrollment-tokens devices audit packages config token reset-store verify-store intent-key init demo help" -f -a "verify-store" -d 'Check one database file (serve runs this before opening it)'
complete -c drover -n "__fish_drover_using_subcommand help; and not __fish_seen_subcommand_from serve nats-config mqtt-config apply get runs describe logs patch-status cancel delete deployments alerts operators enrollment-tokens devices audit packages config token reset-store verify-store intent-key init demo help" -f -a "intent-key" -d 'Print the public key agents pin to check the control plane\'s intent signatures (`intent_public_keys` in the agent\'s config). Run it on the control plane\'s host with its --data'
complete -c drover -n "__fish_drover_using_subcommand help; and not __fish_seen_subcommand_from serve nats-config mqtt-config apply get runs describe logs patch-status cancel delete deployments alerts operators enrollment-tokens devices audit packages config token reset-store verify-store intent-key init demo help" -f -a "init" -d 'Make the data directory\'s keys before the first `serve` (device-token key, operator token, intent key), and with --tls-name a CA and a server certificate for those names: DATA/tls/server.pem and server.key for `serve`, DATA/tls/ca.pem for every agent (ca_file) and operator (DROVER_CA_FILE). Keeps whatever exists'
complete -c drover -n "__fish_drover_using_subcommand help; and not __fish_seen_subcommand_from serve nats-config mqtt-config apply get runs describe logs patch-status cancel delete deployments alerts operators enrollment-tokens devices audit packages config token reset-store verify-store intent-key init demo help" -f -a "demo" -d 'Run the end-to-end demo: control plane, agents and a task run'
complete -c drover -n "__fish_drover_using_subcommand help; and not __fish_seen_subcommand_from serve nats-config mqtt-config apply get runs describe logs patch-status cancel delete deployments alerts operators enrollment-tokens devices audit packages config token reset-store verify-store intent-key init demo help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c drover -n "__fish_drover_using_subcommand help; and __fish_seen_subcommand_from runs" -f -a "watch" -d 'A live progress bar of a task run or a deployment until it finishes (NAME, or deployment/NAME, taskrun/NAME)'
complete -c drover -n "__fish_drover_using_subcommand help; and __fish_seen_subcommand_from deployments" -f -a "add-new-devices" -d 'Run a deployment\'s targeting again and add the devices that match now and are not targets yet (within its 20,000 targets)'
complete -c drover -n "__fish_drover_using_subcommand help; and __fish_seen_subcommand_from alerts" -f -a "ack" -d 'Acknowledge an alert as it stands: listed as acknowledged while its condition lasts, raised again once it clears and returns'
complete -c drover -n "__fish_drover_using_subcommand help; and __fish_seen_subcommand_from operators" -f -a "list" -d 'Every operator, its role and whether it is revoked'
complete -c drover -n "__fish_drover_using_subcommand help; and __fish_seen_subcommand_from operators" -f -a "add" -d 'Add an operator and print its token (shown once, stored as a digest)'
complete -c drover -n "__fish_drover_using_subcommand help; and __fish_seen_subcommand_from operators" -f -a "rotate" -d 'Give an operator a new token; the old one and its dashboard sessions stop working at once'
complete -c drover -n "__fish_drover_using_subcommand help; and __fish_seen_subcommand_from operators" -f -a "revoke" -d 'Revoke an operator: its token and dashboard sessions are refused on every replica'
complete -c drover -n "__fish_drover_using_subcommand help; and __fish_seen_subcommand_from enrollment-tokens" -f -a "list" -d 'Every enrollment token: its groups, labels, uses and state'
complete -c drover -n "__fish_drover_using_subcommand help; and __fish_seen_subcommand_from enrollment-tokens" -f -a "create" -d 'Make a token and print it (shown once, stored as a digest): put it in the devices\' enrollment file'
complete -c drover -n "__fish_drover_using_subcommand help; and __fish_seen_subcommand_from enrollment-tokens" -f -a "revoke" -d 'Revoke a token: devices that enrolled with it stay; no new one can'
complete -c drover -n "__fish_drover_using_subcommand help; and __fish_seen_subcommand_from devices" -f -a "pending" -d 'Devices that enrolled and wait for an operator'
complete -c drover -n "__fish_drover_using_subcommand help; and __fish_seen_subcommand_from devices" -f -a "keys" -d 'Every enrolled key: pending, accepted and rejected'
complete -c drover -n "__fish_drover_using_subcommand help; and __fish_seen_subcommand_from devices" -f -a "accept" -d 'Accept a pending device: it joins with its token\'s groups and labels'
complete -c drover -n "__fish_drover_using_subcommand help; and __fish_seen_subcommand_from devices" -f -a "reject" -d 'Reject a device\'s key: it opens nothing, asking again is refused, and an open session ends'
complete -c drover -n "__fish_drover_using_subcommand help; and __fish_seen_subcommand_from devices" -f -a "preauthorize" -d 'Accept a device\'s key before it asks (the key `drover-agent status` prints on the device): its agent is let in by the key at once'
complete -c drover -n "__fish_drover_using_subcommand help; and __fish_seen_subcommand_from packages" -f -a "upload" -d 'Store a .deb: its name, version and architecture are read from it, its size and SHA-256 recorded. The same file again changes nothing; another file under the same name, version and architecture is refused. The file is streamed with a progress bar at a terminal; an upload that keeps moving is never cut off, one that stops is sent again (3 attempts in all)'
complete -c drover -n "__fish_drover_using_subcommand help; and __fish_seen_subcommand_from config" -f -a "set-context" -d 'Make or change a context: the API\'s address from --server, the CA to trust from --ca-file (init\'s tls/ca.pem), and the token file'
complete -c drover -n "__fish_drover_using_subcommand help; and __fish_seen_subcommand_from config" -f -a "use-context" -d 'Make a context the current one'
complete -c drover -n "__fish_drover_using_subcommand help; and __fish_seen_subcommand_from config" -f -a "get-contexts" -d 'List the contexts, the current one marked with *'
complete -c drover -n "__fish_drover_using_subcommand help; and __fish_seen_subcommand_from config" -f -a "current-context" -d 'Print the current context\'s name'
complete -c drover -n "__fish_drover_using_subcommand help; and __fish_seen_subcommand_from config" -f -a "delete-context" -d 'Remove a context'
