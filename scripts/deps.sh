#!/usr/bin/env bash
# Installs the Debian 12 packages collie needs to build and test, skipping
# those already present. Run as root. Usage: scripts/deps.sh [extra-package ...]
set -euo pipefail
pkgs=(build-essential cmake pkg-config libhwloc-dev libcmocka-dev libibverbs-dev valgrind gdb procps iproute2
      openmpi-bin libopenmpi-dev python3-numpy python3-pytest python3-mpi4py
      etcd-server curl libcurl4-openssl-dev libjson-c-dev python3-torch python3-torchvision "$@")
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
