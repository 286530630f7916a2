#!/usr/bin/python3
"""Runs a command under an OCI/Kubernetes seccomp profile, the way runc applies it.

    /usr/bin/python3 deploy/seccomp/run-under-profile.py deploy/seccomp/ringway-proxy.json -- \
        target/debug/ringway proxy --pod UID=/run/netns/NAME ...

A check for changes to deploy/seccomp/ringway-proxy.json, on a Linux machine instead of a
cluster: the filter is loaded into this process (as runc does just before it executes the
container's entrypoint) and the command is executed under it. A syscall the profile does
not allow fails with EPERM (or the rule's errno), as it would in the pod.

Needs Debian's python3-seccomp (libseccomp's bindings; `apt-get install python3-seccomp`)
and root (or no_new_privs) to load a filter. Syscall names unknown to this architecture are
skipped, as runc skips them.
"""

import json
import os
import sys

import seccomp

OPS = {
    "SCMP_CMP_NE": seccomp.NE,
    "SCMP_CMP_LT": seccomp.LT,
    "SCMP_CMP_LE": seccomp.LE,
    "SCMP_CMP_EQ": seccomp.EQ,
    "SCMP_CMP_GE": seccomp.GE,
    "SCMP_CMP_GT": seccomp.GT,
    "SCMP_CMP_MASKED_EQ": seccomp.MASKED_EQ,
}
EPERM = 1


def action(name, errno):
    if name == "SCMP_ACT_ALLOW":
        return seccomp.ALLOW
    if name == "SCMP_ACT_ERRNO":
        return seccomp.ERRNO(errno if errno is not None else EPERM)
    if name == "SCMP_ACT_KILL":
        return seccomp.KILL
    raise SystemExit(f"unsupported action {name}")


def main():
    if len(sys.argv) < 4 or sys.argv[2] != "--":
        raise SystemExit(__doc__)
    profile = json.load(open(sys.argv[1]))
    cmd = sys.argv[3:]
    f = seccomp.SyscallFilter(defaction=action(profile["defaultAction"], profile.get("defaultErrnoRet")))
    for rule in profile["syscalls"]:
        act = action(rule["action"], rule.get("errnoRet"))
        args = [
            seccomp.Arg(a["index"], OPS[a["op"]], a["value"], a.get("valueTwo", 0))
            if a["op"] == "SCMP_CMP_MASKED_EQ"
            else seccomp.Arg(a["index"], OPS[a["op"]], a["value"])
            for a in rule.get("args", [])
        ]
        for name in rule["names"]:
            try:
                f.add_rule(act, name, *args)
            except (RuntimeError, ValueError, OSError):
                pass  # not a syscall of this architecture
    f.load()
    os.execvp(cmd[0], cmd)


main()
