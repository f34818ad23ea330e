# Job `serve` (sourced by /init): a guest that lives for many jobs.
# ttyS2 is a bidirectional control channel (a socket on the host). The host
# sends one command per line; the guest answers on the same port:
#   file PATH SECTOR BYTES  copy BYTES from the input disk (PC_IN_DISK) at
#                           SECTOR to /PATH (the host wrote them there)
#   job NAME                run /pc/NAME.sh with /pc/job.env in a subshell,
#                           its result lines, then "done"
#   quit                    power off
# A job that fails powers the guest off ("error ..." first, as in one-job
# boots); the host then boots a new guest for the next job.
exec 7< /dev/ttyS2
result "ready"
while read -r word a b c <&7; do
    case "$word" in
    file)
        # The host rewrote the disk behind the guest's back: drop its cache first.
        blockdev --flushbufs "$PC_IN_DISK" || fail "blockdev --flushbufs $PC_IN_DISK failed"
        d=${a%/*}
        [ "$d" = "$a" ] || [ -d "/$d" ] || mkdir -p "/$d"
        dd if="$PC_IN_DISK" of="/$a" bs=512 skip="$b" count=$(( (c + 511) / 512 )) 2> /dev/null \
            || fail "reading $a from $PC_IN_DISK failed"
        truncate -s "$c" "/$a"
        case "$a" in *.env) ;; *) chmod +x "/$a" ;; esac
        result "ok" ;;
    job)
        echo "pc: job $a" > /dev/console
        ( . /pc/job.env; . "/pc/$a.sh" )
        result "done" ;;
    quit)
        break ;;
    esac
done
