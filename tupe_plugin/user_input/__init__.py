"""What a user gives the plugin, checked and refused in words that name the fix: the plugin's errors as one
``error:`` line (:mod:`.user_errors`), fixes worded for the command being run (:mod:`.command_hints`),
argparse types (:mod:`.cli_types`), paths of the wrong kind (:mod:`.path_checks`), sizes past the machine's
memory (:mod:`.memory_limits`) and outputs that would overwrite an input (:mod:`.overwritten_inputs`).

May import the standard library only; every other room builds on it.
"""
