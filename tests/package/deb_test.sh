#!/usr/bin/env bash
# deb_package_test: the operator's path with the Debian package, end to end, on this machine.
#
#   deb_test.sh BUILD_DIR SOURCE_DIR VERSION
#
# 1. builds the package (`cmake --build BUILD_DIR --target package`) and checks what it holds;
# 2. installs it with `dpkg -i`: the user and group from the sysusers.d entry exist, the linker
#    knows libtierclient;
# 3. configures it as the README says (/etc/tierd/tierd.conf: pool_bytes, metrics_listen) and starts
#    tierd the way the unit does: `systemctl start tierd` where systemd is PID 1, else the unit's
#    own ExecStart command line as its User=/Group=, with its runtime and state directories;
# 4. `tierctl status` (default socket) and a scrape of /metrics;
# 5. a C++ program built against the installed package alone, once through find_package(Tier) and
#    once through pkg-config, offloads and reloads 4 MiB and checks every byte; a wheel of the
#    Python package built without a library finds the package's libtierclient and does the same;
# 6. stops tierd, `dpkg --purge`s the package and checks that nothing is left: no file it
#    installed, no /etc/tierd, /var/lib/tierd or /run/tierd, no unit symlink, no linker cache
#    entry. The user `tierd` and group `tier` are kept by purge (deploy/debian/postrm says why);
#    the test removes them afterwards when it created them.
#
# Needs root and dpkg (CI runs as root on Debian 12); exits 77 (CTest: skipped) with the reason
# otherwise, and when a tierd package or files of another Tierd install are present here, which it
# leaves alone.
set -euo pipefail

build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
version=$3
# Debian's interpreter (pip, venv), not whichever python3 comes first on PATH.
py=/usr/bin/python3
[ -x "$py" ] || py=python3

say() { echo "deb_package_test: $*"; }
fail() {
  echo "deb_package_test: FAIL: $*" >&2
  exit 1
}
skip() {
  echo "deb_package_test: SKIP: $*"
  exit 77
}

[ "$(id -u)" -eq 0 ] || skip "needs root to install a package (dpkg -i); CI runs as root"
{ command -v dpkg && command -v dpkg-deb; } >/dev/null || skip "no dpkg on this machine"
# (Pipes into `grep -q` are avoided throughout: with pipefail, the writer's SIGPIPE when grep
# stops reading early would read as "no match".)
package_status() { dpkg-query -W -f='${Status}' tierd 2>/dev/null || true; }
if [ -n "$(package_status)" ] && ! grep -q "not-installed" <<<"$(package_status)"; then
  skip "a tierd package is already on this machine ($(dpkg-query -W -f='${Version} ${Status}' tierd)); not touching it"
fi
for path in /usr/bin/tierd /usr/bin/tierctl /usr/lib/libtierclient.so.0 /etc/tierd /var/lib/tierd \
            /run/tierd /lib/systemd/system/tierd.service /etc/systemd/system/tierd.service; do
  [ -e "$path" ] && skip "$path exists (another Tierd install); not touching it"
done

work=$(mktemp -d /tmp/tierd-deb-XXXXXX)
user_existed=0
getent passwd tierd >/dev/null && user_existed=1
group_existed=0
getent group tier >/dev/null && group_existed=1
started=""   # "systemd" or the pid of a tierd started from the unit's ExecStart
installed=0

cleanup() {
  local rc=$?
  if [ "$started" = systemd ]; then
    systemctl stop tierd.service || true
  elif [ -n "$started" ]; then
    kill -TERM "$started" 2>/dev/null || true
    wait "$started" 2>/dev/null || true
    rm -rf /run/tierd
  fi
  if [ "$installed" -eq 1 ]; then
    dpkg --purge tierd >/dev/null 2>&1 || true
  fi
  if [ "$user_existed" -eq 0 ] && getent passwd tierd >/dev/null; then userdel tierd || true; fi
  if [ "$group_existed" -eq 0 ] && getent group tier >/dev/null; then groupdel tier || true; fi
  rm -rf "$work"
  exit "$rc"
}
trap cleanup EXIT

# --- 1. build the package and look inside --------------------------------------------------------
say "building the package: cmake --build $build --target package"
cmake --build "$build" --target package >"$work/cpack.log" 2>&1 || {
  cat "$work/cpack.log"
  fail "the package target failed"
}
arch=$(dpkg --print-architecture)
deb="$build/tierd_${version}_${arch}.deb"
[ -f "$deb" ] || fail "no $deb after the package target (see above)"
say "built $(basename "$deb") ($(du -k "$deb" | cut -f1) KiB)"

[ "$(dpkg-deb -f "$deb" Package)" = tierd ] || fail "package name is not tierd"
[ "$(dpkg-deb -f "$deb" Version)" = "$version" ] || fail "package version is not $version"
depends=$(dpkg-deb -f "$deb" Depends)
say "Depends: $depends"
for lib in libc6 libgrpc++ libprotobuf libsystemd0 liburing; do
  grep -q "$lib" <<<"$depends" || fail "Depends lacks $lib (dpkg-shlibdeps did not run?)"
done
dpkg-deb -c "$deb" | awk '{print $6}' | sed 's|^\./|/|' >"$work/contents"
for path in /usr/bin/tierd /usr/bin/tierctl /usr/lib/libtierclient.so.0 \
            "/usr/lib/libtierclient.so.$version" /usr/lib/libtierclient.so \
            /usr/include/tier/tier.h /usr/include/tier/client.hpp /usr/lib/pkgconfig/tierclient.pc \
            /usr/lib/cmake/Tier/TierConfig.cmake /usr/lib/cmake/Tier/TierConfigVersion.cmake \
            /usr/lib/cmake/Tier/TierTargets.cmake /lib/systemd/system/tierd.service \
            /etc/tierd/tierd.conf /usr/lib/sysusers.d/tierd.conf; do
  grep -qx "$path" "$work/contents" || fail "the package lacks $path"
done
if grep -E 'tier_demo|dist-packages|site-packages|/usr/local' "$work/contents"; then
  fail "the package holds files that are not its own (above)"
fi
dpkg-deb -e "$deb" "$work/control"
grep -qx /etc/tierd/tierd.conf "$work/control/conffiles" || fail "tierd.conf is not a conffile"
dpkg-deb --fsys-tarfile "$deb" | tar -xO ./lib/systemd/system/tierd.service >"$work/unit"
exec_start=$(sed -n 's/^ExecStart=//p' "$work/unit")
[ "$exec_start" = "/usr/bin/tierd --config=/etc/tierd/tierd.conf" ] ||
  fail "the unit's ExecStart is '$exec_start', not the packaged tierd"
cmp -s <(grep -v '^ExecStart=' "$work/unit") <(grep -v '^ExecStart=' "$src/deploy/tierd.service") ||
  fail "the packaged unit differs from deploy/tierd.service beyond ExecStart"
say "contents, conffiles and unit ok"

# --- 2. install ----------------------------------------------------------------------------------
say "installing: dpkg -i $(basename "$deb")"
installed=1
dpkg -i "$deb" >"$work/dpkg-i.log" 2>&1 || {
  cat "$work/dpkg-i.log"
  fail "dpkg -i failed"
}
[ "$(package_status)" = "install ok installed" ] || fail "tierd not installed"
getent group tier >/dev/null || fail "postinst did not create group tier"
IFS=: read -r _ _ _ tierd_gid _ tierd_home tierd_shell < <(getent passwd tierd) ||
  fail "postinst did not create user tierd"
[ "$tierd_gid" = "$(getent group tier | cut -d: -f3)" ] || fail "tierd's primary group is not tier"
[ "$tierd_home" = /var/lib/tierd ] || fail "tierd's home is $tierd_home"
[ "$tierd_shell" = /usr/sbin/nologin ] || fail "tierd's shell is $tierd_shell"
grep -q 'libtierclient.so.0 ' <<<"$(ldconfig -p)" || fail "the linker cache does not know libtierclient.so.0"
say "installed: user tierd (group tier), libtierclient.so.0 in the linker cache"

# --- 3. configure and start as the unit does -----------------------------------------------------
port=$("$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
# What the README tells the operator: size the pool, turn the metrics on.
cat >>/etc/tierd/tierd.conf <<EOF

# Set by deb_package_test.
pool_bytes = 128M
metrics_listen = 127.0.0.1:$port
EOF
unset TIER_SOCKET XDG_RUNTIME_DIR  # so tierctl and the clients use the default socket
socket=/run/tierd/tierd.sock
tierctl=/usr/bin/tierctl
if [ -d /run/systemd/system ]; then
  say "systemd is PID 1: systemctl start tierd"
  systemctl daemon-reload
  started=systemd
  systemctl start tierd.service || {
    journalctl -u tierd --no-pager | tail -30
    fail "systemctl start tierd failed"
  }
  pid=$(systemctl show -p MainPID --value tierd.service)
else
  say "systemd is not PID 1 here: running the unit's ExecStart ($exec_start) as it would:" \
      "User=tierd Group=tier UMask=0007, RuntimeDirectory /run/tierd, StateDirectory" \
      "/var/lib/tierd (+spill), LimitMEMLOCK=infinity, CAP_IPC_LOCK where this container has it"
  install -d -m 0750 -o tierd -g tier /run/tierd /var/lib/tierd /var/lib/tierd/spill
  caps=(--inh-caps=+ipc_lock --ambient-caps=+ipc_lock)
  if ! setpriv --reuid=tierd --regid=tier --init-groups "${caps[@]}" true 2>/dev/null; then
    say "no CAP_IPC_LOCK to hand on in this container: starting without it (pool_lock is best-effort)"
    caps=()
  fi
  (
    cd /
    umask 0007
    ulimit -l unlimited 2>/dev/null || true
    ulimit -n 65536 2>/dev/null || true
    # shellcheck disable=SC2086  # the unit's command line, split into words as systemd does
    exec env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin RUNTIME_DIRECTORY=/run/tierd \
      STATE_DIRECTORY=/var/lib/tierd:/var/lib/tierd/spill \
      setpriv --reuid=tierd --regid=tier --init-groups "${caps[@]}" $exec_start
  ) >"$work/tierd.log" 2>&1 &
  started=$!
  pid=$started
fi
for _ in $(seq 300); do
  "$tierctl" health >/dev/null 2>&1 && break
  if [ "$started" != systemd ] && ! kill -0 "$started" 2>/dev/null; then
    cat "$work/tierd.log"
    fail "tierd exited at start (log above)"
  fi
  sleep 0.1
done
"$tierctl" health >/dev/null || fail "tierd does not serve on $socket after 30 s"
# The owner of /proc/PID is the process's user (no procps needed).
[ "$(stat -c %U "/proc/$pid")" = tierd ] || fail "tierd runs as $(stat -c %U "/proc/$pid"), not tierd"
[ "$(stat -c '%U:%G %a' "$socket")" = "tierd:tier 660" ] ||
  fail "socket is $(stat -c '%U:%G %a' "$socket"), not tierd:tier 660"
say "tierd serving on $socket (pid $pid, user tierd), socket tierd:tier 0660"

# --- 4. tierctl status, metrics ------------------------------------------------------------------
"$tierctl" status | tee "$work/status"
grep -q "$version" "$work/status" || fail "tierctl status does not show version $version"
"$tierctl" --json status >"$work/status.json"
"$py" - "$work/status.json" "$version" <<'EOF' || fail "tierctl --json status is not what the config says"
import json, sys
s = json.load(open(sys.argv[1]))
assert s["version"] == sys.argv[2], s["version"]
host = [t for t in s["tiers"] if t["name"] == "host"]
assert host and host[0]["capacity_bytes"] == 128 << 20, s["tiers"]
EOF
"$py" - "$port" "$version" <<'EOF' || fail "GET /metrics on 127.0.0.1:$port"
import sys, urllib.request
text = urllib.request.urlopen("http://127.0.0.1:%s/metrics" % sys.argv[1], timeout=10).read().decode()
want = 'tierd_build_info{version="%s"' % sys.argv[2]
assert want in text, text[:2000]
assert 'tierd_tier_capacity_bytes{tier="host"} 134217728' in text, text[:2000]
EOF
say "tierctl status and /metrics (metrics_listen from tierd.conf) ok"

# --- 5. clients built against the installed package ----------------------------------------------
cp -r "$src/tests/package/consumer" "$work/consumer"
say "building a C++ client with find_package(Tier) against the package"
cmake -S "$work/consumer" -B "$work/consumer/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  >"$work/consumer.log" 2>&1 || {
  cat "$work/consumer.log"
  fail "configuring the consumer (find_package(Tier)) failed"
}
grep -q "Tier $version from /usr/lib/cmake/Tier" "$work/consumer.log" || {
  cat "$work/consumer.log"
  fail "find_package(Tier) did not find the installed package"
}
cmake --build "$work/consumer/build" >>"$work/consumer.log" 2>&1 || {
  cat "$work/consumer.log"
  fail "building the consumer failed"
}
grep -Eq 'libtierclient.so.0 => (/usr)?/lib/libtierclient.so.0 ' <<<"$(ldd "$work/consumer/build/tier_consumer")" ||
  fail "the consumer does not load the package's libtierclient: $(ldd "$work/consumer/build/tier_consumer")"
"$work/consumer/build/tier_consumer" || fail "round trip through find_package(Tier) build"

say "building the same client with pkg-config tierclient"
[ "$(pkg-config --modversion tierclient)" = "$version" ] || fail "pkg-config tierclient version"
[ "$(pkg-config --variable=includedir tierclient)" = /usr/include ] || fail "pkg-config includedir"
# shellcheck disable=SC2046
g++ -std=c++17 -Wall -Wextra -Werror -o "$work/tier_consumer_pc" \
  "$work/consumer/tier_consumer.cc" $(pkg-config --cflags --libs tierclient) ||
  fail "building the consumer with pkg-config failed"
"$work/tier_consumer_pc" "$socket" || fail "round trip through the pkg-config build"

if "$py" -m pip --version >/dev/null 2>&1 && "$py" -c 'import venv' 2>/dev/null; then
  say "a wheel built with no library of its own finds the package's libtierclient"
  cp -r "$src/python" "$work/python"
  rm -rf "$work/python/tests" "$work/python/build" "$work/python"/*.egg-info "$work/python/tier/_lib"/libtierclient.so*
  (cd "$work" && env -u TIER_BUILD_DIR -u TIER_LIBRARY PIP_NO_INDEX=1 \
     "$py" -m pip wheel --no-deps --no-index -w "$work/dist" "$work/python") >"$work/wheel.log" 2>&1 || {
    cat "$work/wheel.log"
    fail "pip wheel ./python failed"
  }
  wheel=$(ls "$work"/dist/tierd_client-"$version"-*.whl)
  "$py" -c 'import sys, zipfile; sys.exit(any("libtierclient" in n for n in zipfile.ZipFile(sys.argv[1]).namelist()))' "$wheel" ||
    fail "the wheel built with no library around carries one anyway"
  "$py" -m venv --system-site-packages --without-pip "$work/venv"
  env -u PYTHONPATH PIP_NO_INDEX=1 "$work/venv/bin/python" -m pip install --no-deps --no-index "$wheel" \
    >>"$work/wheel.log" 2>&1 || {
    cat "$work/wheel.log"
    fail "installing the wheel into a venv failed"
  }
  (cd "$work" && env -u TIER_BUILD_DIR -u TIER_LIBRARY -u PYTHONPATH "$work/venv/bin/python" - "$work/venv" "$version" <<'EOF') ||
import sys
import tier
assert tier.__file__.startswith(sys.argv[1]), tier.__file__
path = tier.library_path()
assert not path.startswith(sys.argv[1]) and "libtierclient.so.0" in path, path
assert tier.__version__ == tier.library_version() == sys.argv[2], (tier.__version__, tier.library_version())
with tier.Client() as c:  # the default socket: /run/tierd/tierd.sock
    b = c.alloc_host_buffer(1 << 20)
    b.view()[:] = bytes(range(256)) * 4096
    o, j = c.offload_buffer(b, 0, 1 << 20)
    c.wait(j)
    b.view()[:] = bytes(1 << 20)
    c.wait(c.reload_buffer(o, b, 0, 1 << 20))
    assert bytes(b.view()) == bytes(range(256)) * 4096
print("python round trip ok through", path)
EOF
    fail "the wheel's tier.Client() against the packaged tierd"
else
  say "no pip for python3: the wheel step is left out (apt-get install python3-pip python3-venv)"
fi

# --- 6. stop, purge, nothing left ----------------------------------------------------------------
if [ "$started" = systemd ]; then
  systemctl stop tierd.service
  [ ! -e /run/tierd ] || fail "systemd left /run/tierd after stop"
else
  kill -TERM "$started"
  rc=0
  wait "$started" || rc=$?
  [ "$rc" -eq 0 ] || {
    cat "$work/tierd.log"
    fail "tierd exited $rc on SIGTERM"
  }
  rm -rf /run/tierd  # RuntimeDirectory= is removed by systemd when the unit stops
fi
started=""
say "tierd stopped"

dpkg-query -L tierd >"$work/files"
say "purging: dpkg --purge tierd"
dpkg --purge tierd >"$work/purge.log" 2>&1 || {
  cat "$work/purge.log"
  fail "dpkg --purge failed"
}
installed=0
if [ -n "$(package_status)" ] && ! grep -q "not-installed" <<<"$(package_status)"; then
  fail "dpkg still knows tierd: $(dpkg-query -W -f='${Status}' tierd)"
fi
left=()
while read -r path; do
  case "$path" in
    /. | /etc | /lib | /lib/systemd | /lib/systemd/system | /usr | /usr/bin | /usr/include | \
      /usr/lib | /usr/lib/cmake | /usr/lib/pkgconfig | /usr/lib/sysusers.d | /usr/share | \
      /usr/share/doc) continue ;;  # shared with other packages
  esac
  if [ -e "$path" ] || [ -L "$path" ]; then left+=("$path"); fi
done <"$work/files"
for path in /etc/tierd /var/lib/tierd /run/tierd; do
  if [ -e "$path" ]; then left+=("$path"); fi
done
while read -r path; do left+=("$path"); done < <(find /etc/systemd /lib/systemd/system -name 'tierd*' 2>/dev/null)
if grep -q libtierclient <<<"$(ldconfig -p)"; then left+=("libtierclient in the linker cache"); fi
[ ${#left[@]} -eq 0 ] || fail "left behind after purge: ${left[*]}"
{ getent passwd tierd && getent group tier; } >/dev/null ||
  fail "purge removed user tierd or group tier (they are meant to stay: deploy/debian/postrm)"
say "purged: no file, directory, unit link or cache entry left; user tierd and group tier kept" \
    "(Debian keeps system users)$([ "$user_existed" -eq 0 ] && echo "; the test removes them now")"
say "PASS"
