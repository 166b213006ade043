"""What the command-line tools share beyond checking their input: the fairseq commands of this environment
and the ``--user-dir`` (:mod:`.fairseq_tools`), child processes that end with their parent
(:mod:`.child_processes`), fairseq-train's logs read back (:mod:`.fairseq_logs`) and its progress
(tupe-show-progress, :mod:`.progress`), output folders written whole (:mod:`.prepared_folder`) and the
extras' packages (:mod:`.extras`).

May import :mod:`tupe_plugin.user_input` and the standard library; never the model or the tools above it.
"""
