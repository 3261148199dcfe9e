package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"seckill/internal/testenv"
)

// In production Redis asks who is calling: an ACL user and its password
// (REDIS_USERNAME, REDIS_PASSWORD). The server buys with them, and with a
// wrong password it refuses to start, saying why, instead of serving 503s.
func TestRedisACLUser(t *testing.T) {
	// No default user: a client that does not log in can do nothing.
	srv := testenv.StartRedis(t, "--user", "default", "off", "--user", "seckill", "on", ">s3cret-pass", "~*", "&*", "+@all")
	st := newStack(t, 0)
	env := st.env(freeAddr(t), "REDIS_ADDR", srv.Addr(), "REDIS_DB", "0", "REDIS_USERNAME", "seckill", "REDIS_PASSWORD", "s3cret-pass")
	in := start(t, env)
	admin, _ := mustLogin(t, in.Base, adminPhone)
	vid := openVoucher(t, in.Base, admin, 1)
	buyer := loginMany(t, in.Base, 1)[0]
	if r := mustCall(t, "POST", in.Base+"/seckill/"+vid, buyer.Token, nil); r.Status != http.StatusOK {
		t.Fatalf("buy as ACL user seckill: %d %s", r.Status, r.Raw)
	}

	env = st.env(freeAddr(t), "REDIS_ADDR", srv.Addr(), "REDIS_USERNAME", "seckill", "REDIS_PASSWORD", "wrong", "STARTUP_WAIT", "1s")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var log syncBuffer
	err := run(ctx, func(k string) string { return env[k] }, &log)
	if err == nil || !strings.Contains(err.Error(), "WRONGPASS") {
		t.Fatalf("start with a wrong Redis password: %v, want an error naming WRONGPASS", err)
	}
}

// REDIS_TLS with a private CA (REDIS_TLS_CA): the server buys over TLS and
// verifies Redis' certificate; against the system's roots alone the same
// certificate is refused, and the server does not start.
func TestRedisTLS(t *testing.T) {
	dir := t.TempDir()
	caFile, certFile, keyFile := writeTestCA(t, dir)
	tlsAddr := freeAddr(t)
	_, tlsPort, _ := net.SplitHostPort(tlsAddr)
	testenv.StartRedis(t, "--tls-port", tlsPort, "--tls-cert-file", certFile, "--tls-key-file", keyFile,
		"--tls-ca-cert-file", caFile, "--tls-auth-clients", "no")
	st := newStack(t, 0)
	// "localhost": the certificate's name, so that verification means it.
	redisAddr := "localhost:" + tlsPort
	in := start(t, st.env(freeAddr(t), "REDIS_ADDR", redisAddr, "REDIS_TLS", "true", "REDIS_TLS_CA", caFile))
	admin, _ := mustLogin(t, in.Base, adminPhone)
	vid := openVoucher(t, in.Base, admin, 1)
	buyer := loginMany(t, in.Base, 1)[0]
	if r := mustCall(t, "POST", in.Base+"/seckill/"+vid, buyer.Token, nil); r.Status != http.StatusOK {
		t.Fatalf("buy over TLS: %d %s", r.Status, r.Raw)
	}

	env := st.env(freeAddr(t), "REDIS_ADDR", redisAddr, "REDIS_TLS", "true", "STARTUP_WAIT", "1s")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := run(ctx, func(k string) string { return env[k] }, &syncBuffer{})
	if err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("TLS to a certificate of an unknown CA: %v, want a refusal naming the certificate", err)
	}
}

// writeTestCA writes a CA, and a certificate for localhost and 127.0.0.1
// signed by it, as PEM files in dir.
func writeTestCA(t *testing.T, dir string) (caFile, certFile, keyFile string) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	ca := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "seckill test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	leaf := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "localhost"},
		DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	leafDER, err := x509.CreateCertificate(rand.Reader, leaf, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	write := func(name, typ string, der []byte) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	return write("ca.pem", "CERTIFICATE", caDER), write("redis.pem", "CERTIFICATE", leafDER), write("redis.key", "EC PRIVATE KEY", keyDER)
}
