# Print an optspec for argparse to handle cmd's options that are independent of any subcommand.
function __fish_drover_agent_global_optspecs
    string join \n config= h/help V/version
end

function __fish_drover_agent_needs_command
    # Figure out if the current invocation already has a command.
    set -l cmd (commandline -opc)
    set -e cmd[1]
    argparse -s (__fish_drover_agent_global_optspecs) -- $cmd 2>/dev/null
    or return
    if set -q argv[1]
        # Also print the command, so this can be used to figure out what it is.
        echo $argv[1]
        return 1
    end
    return 0
end

function __fish_drover_agent_using_subcommand
    set -l cmd (__fish_drover_agent_needs_command)
    test -z "$cmd"
    and return 1
    contains -- $cmd[1] $argv
end

complete -c drover-agent -n "__fish_drover_agent_needs_command" -l config -d 'The agent\'s config file' -r -F
complete -c drover-agent -n "__fish_drover_agent_needs_command" -s h -l help -d 'Print help'
complete -c drover-agent -n "__fish_drover_agent_needs_command" -s V -l version -d 'Print version'
complete -c drover-agent -n "__fish_drover_agent_needs_command" -f -a "run" -d 'Run the agent daemon'
complete -c drover-agent -n "__fish_drover_agent_needs_command" -f -a "check" -d 'Check the config file and say what it sets up'
complete -c drover-agent -n "__fish_drover_agent_needs_command" -f -a "status" -d 'Show the running agent\'s state (from its status socket)'
complete -c drover-agent -n "__fish_drover_agent_needs_command" -f -a "upgrade" -d 'Run a system upgrade now, as a local job of the running agent, and print each step as it finishes'
complete -c drover-agent -n "__fish_drover_agent_needs_command" -f -a "assess" -d 'Assess now, as a local job of the running agent: refresh apt\'s lists as an upgrade does, then print what a full upgrade would change (security updates first) and whether a reboot is pending. Installs nothing'
complete -c drover-agent -n "__fish_drover_agent_needs_command" -f -a "reset-store" -d 'Move a damaged or empty agent database aside; the agent then starts with a new, empty one (its jobs and unsent statuses are gone). Refused while an agent holds the database; asks first unless --yes'
complete -c drover-agent -n "__fish_drover_agent_needs_command" -f -a "verify-store" -d 'Check one agent database file (the agent runs this before opening it)'
complete -c drover-agent -n "__fish_drover_agent_needs_command" -f -a "logs" -d 'Print a job\'s output as this device keeps it: each apt and dpkg call of each step, its command and exit status, its stdout and stderr. The latest job\'s when no job is named'
complete -c drover-agent -n "__fish_drover_agent_needs_command" -f -a "jobs" -d 'List recent jobs with their steps and errors'
complete -c drover-agent -n "__fish_drover_agent_needs_command" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c drover-agent -n "__fish_drover_agent_using_subcommand run" -l config -d 'The agent\'s config file' -r -F
complete -c drover-agent -n "__fish_drover_agent_using_subcommand run" -s h -l help -d 'Print help'
complete -c drover-agent -n "__fish_drover_agent_using_subcommand check" -l config -d 'The agent\'s config file' -r -F
complete -c drover-agent -n "__fish_drover_agent_using_subcommand check" -l connect -d 'Also connect to the control plane (or broker) with this device\'s token, and say whether it lets the device in. A running agent\'s connection is left alone'
complete -c drover-agent -n "__fish_drover_agent_using_subcommand check" -s h -l help -d 'Print help'
complete -c drover-agent -n "__fish_drover_agent_using_subcommand status" -l socket -d 'The status socket, if not the one in the config' -r -F
complete -c drover-agent -n "__fish_drover_agent_using_subcommand status" -l config -d 'The agent\'s config file' -r -F
complete -c drover-agent -n "__fish_drover_agent_using_subcommand status" -l json
complete -c drover-agent -n "__fish_drover_agent_using_subcommand status" -s h -l help -d 'Print help'
complete -c drover-agent -n "__fish_drover_agent_using_subcommand upgrade" -l resume -d 'Continue this failed local upgrade from its failed step instead' -r
complete -c drover-agent -n "__fish_drover_agent_using_subcommand upgrade" -l socket -r -F
complete -c drover-agent -n "__fish_drover_agent_using_subcommand upgrade" -l config -d 'The agent\'s config file' -r -F
complete -c drover-agent -n "__fish_drover_agent_using_subcommand upgrade" -s h -l help -d 'Print help'
complete -c drover-agent -n "__fish_drover_agent_using_subcommand assess" -l socket -r -F
complete -c drover-agent -n "__fish_drover_agent_using_subcommand assess" -l config -d 'The agent\'s config file' -r -F
complete -c drover-agent -n "__fish_drover_agent_using_subcommand assess" -s h -l help -d 'Print help'
complete -c drover-agent -n "__fish_drover_agent_using_subcommand reset-store" -l config -d 'The agent\'s config file' -r -F
complete -c drover-agent -n "__fish_drover_agent_using_subcommand reset-store" -l yes -d 'Do not ask: the database is moved aside (for scripts)'
complete -c drover-agent -n "__fish_drover_agent_using_subcommand reset-store" -s h -l help -d 'Print help'
complete -c drover-agent -n "__fish_drover_agent_using_subcommand verify-store" -l config -d 'The agent\'s config file' -r -F
complete -c drover-agent -n "__fish_drover_agent_using_subcommand verify-store" -s h -l help -d 'Print help'
complete -c drover-agent -n "__fish_drover_agent_using_subcommand logs" -l tail -d 'Only the last N lines' -r
complete -c drover-agent -n "__fish_drover_agent_using_subcommand logs" -l config -d 'The agent\'s config file' -r -F
complete -c drover-agent -n "__fish_drover_agent_using_subcommand logs" -s h -l help -d 'Print help'
complete -c drover-agent -n "__fish_drover_agent_using_subcommand jobs" -l limit -r
complete -c drover-agent -n "__fish_drover_agent_using_subcommand jobs" -l socket -r -F
complete -c drover-agent -n "__fish_drover_agent_using_subcommand jobs" -l config -d 'The agent\'s config file' -r -F
complete -c drover-agent -n "__fish_drover_agent_using_subcommand jobs" -l json
complete -c drover-agent -n "__fish_drover_agent_using_subcommand jobs" -s h -l help -d 'Print help'
complete -c drover-agent -n "__fish_drover_agent_using_subcommand help; and not __fish_seen_subcommand_from run check status upgrade assess reset-store verify-store logs jobs help" -f -a "run" -d 'Run the agent daemon'
complete -c drover-agent -n "__fish_drover_agent_using_subcommand help; and not __fish_seen_subcommand_from run check status upgrade assess reset-store verify-store logs jobs help" -f -a "check" -d 'Check the config file and say what it sets up'
complete -c drover-agent -n "__fish_drover_agent_using_subcommand help; and not __fish_seen_subcommand_from run check status upgrade assess reset-store verify-store logs jobs help" -f -a "status" -d 'Show the running agent\'s state (from its status socket)'
complete -c drover-agent -n "__fish_drover_agent_using_subcommand help; and not __fish_seen_subcommand_from run check status upgrade assess reset-store verify-store logs jobs help" -f -a "upgrade" -d 'Run a system upgrade now, as a local job of the running agent, and print each step as it finishes'
complete -c drover-agent -n "__fish_drover_agent_using_subcommand help; and not __fish_seen_subcommand_from run check status upgrade assess reset-store verify-store logs jobs help" -f -a "assess" -d 'Assess now, as a local job of the running agent: refresh apt\'s lists as an upgrade does, then print what a full upgrade would change (security updates first) and whether a reboot is pending. Installs nothing'
complete -c drover-agent -n "__fish_drover_agent_using_subcommand help; and not __fish_seen_subcommand_from run check status upgrade assess reset-store verify-store logs jobs help" -f -a "reset-store" -d 'Move a damaged or empty agent database aside; the agent then starts with a new, empty one (its jobs and unsent statuses are gone). Refused while an agent holds the database; asks first unless --yes'
complete -c drover-agent -n "__fish_drover_agent_using_subcommand help; and not __fish_seen_subcommand_from run check status upgrade assess reset-store verify-store logs jobs help" -f -a "verify-store" -d 'Check one agent database file (the agent runs this before opening it)'
complete -c drover-agent -n "__fish_drover_agent_using_subcommand help; and not __fish_seen_subcommand_from run check status upgrade assess reset-store verify-store logs jobs help" -f -a "logs" -d 'Print a job\'s output as this device keeps it: each apt and dpkg call of each step, its command and exit status, its stdout and stderr. The latest job\'s when no job is named'
complete -c drover-agent -n "__fish_drover_agent_using_subcommand help; and not __fish_seen_subcommand_from run check status upgrade assess reset-store verify-store logs jobs help" -f -a "jobs" -d 'List recent jobs with their steps and errors'
complete -c drover-agent -n "__fish_drover_agent_using_subcommand help; and not __fish_seen_subcommand_from run check status upgrade assess reset-store verify-store logs jobs help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
