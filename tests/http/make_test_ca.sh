#!/bin/sh
# Makes a throwaway test CA and server certificates in directory $1 (nothing is committed):
#   ca.pem                      the test CA (what the client is told to trust)
#   good.pem / good.key         for localhost and 127.0.0.1, signed by the CA
#   wrong_name.pem / .key       for wrong.example, signed by the CA
#   expired.pem / .key          for localhost and 127.0.0.1, signed by the CA, valid only in 2020
#   unknown_ca.pem / .key       for localhost and 127.0.0.1, signed by a second CA nobody trusts
# OpenSSL 3.0's `x509 -req` cannot back-date a certificate, so every leaf is issued with `openssl
# ca`, whose -startdate/-enddate can.
set -eu
dir=$1
mkdir -p "$dir"
cd "$dir"

make_ca() {  # name
    openssl req -x509 -newkey rsa:2048 -nodes -keyout "$1.key" -out "$1.pem" -days 30 \
        -subj "/CN=moat test $1" -addext basicConstraints=critical,CA:TRUE \
        -addext keyUsage=critical,keyCertSign,cRLSign 2>/dev/null
    mkdir -p "$1.db"
    : > "$1.db/index.txt"
    cat > "$1.cnf" <<CNF
[ca]
default_ca = this
[this]
dir = $dir/$1.db
database = \$dir/index.txt
new_certs_dir = \$dir
serial = \$dir/serial
rand_serial = yes
default_md = sha256
policy = anything
unique_subject = no
copy_extensions = copy
[anything]
commonName = supplied
CNF
}

issue() {  # ca name san startdate enddate
    openssl req -newkey rsa:2048 -nodes -keyout "$2.key" -out "$2.csr" -subj "/CN=$2" \
        -addext "subjectAltName=$3" -addext basicConstraints=CA:FALSE \
        -addext extendedKeyUsage=serverAuth 2>/dev/null
    openssl ca -batch -config "$1.cnf" -cert "$1.pem" -keyfile "$1.key" -in "$2.csr" \
        -out "$2.pem" -startdate "$4" -enddate "$5" -notext 2>/dev/null
}

make_ca ca
make_ca other_ca
local_names="DNS:localhost,IP:127.0.0.1"
issue ca good "$local_names" 20240101000000Z 20991231000000Z
issue ca wrong_name "DNS:wrong.example" 20240101000000Z 20991231000000Z
issue ca expired "$local_names" 20200101000000Z 20200201000000Z
issue other_ca unknown_ca "$local_names" 20240101000000Z 20991231000000Z
