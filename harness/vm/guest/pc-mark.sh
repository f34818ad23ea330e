#!/bin/sh
# pc-mark TEXT: add one mark to the dm-log-writes log and return once it is
# logged (a synchronous alternative to writing to $POWERCUT_MARK_FILE).
exec /usr/sbin/dmsetup message "$PC_LOGWRITES_DEV" 0 mark "$*"
