package main

import (
	"bytes"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"seckill/internal/testenv"
)

// TestAgainstTheDemo rehearses a small sale on the embedded demo, built
// and started as a user would (go run ./cmd/server), with -room both: the
// same crowd without a waiting room and with one. Both sales pass every
// check; the second's report has the line, and its buyers were admitted.
func TestAgainstTheDemo(t *testing.T) {
	testenv.Integration(t, "cmd/server (the embedded demo)")
	t.Parallel()
	bin := filepath.Join(t.TempDir(), "server")
	if out, err := exec.Command("go", "build", "-o", bin, "../server").CombinedOutput(); err != nil {
		t.Fatalf("build cmd/server: %v\n%s", err, out)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	var log bytes.Buffer
	srv := exec.Command(bin)
	// Every simulated user comes from 127.0.0.1: the cap on one address's
	// connections would cut the crowd (docs/rehearse.md, "Limits").
	srv.Env = append(os.Environ(), "HTTP_ADDR="+addr, "MAX_CONNS_PER_ADDR=0")
	srv.Stdout, srv.Stderr = &log, &log
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		srv.Process.Kill()
		srv.Wait()
		if t.Failed() {
			t.Logf("the demo's log:\n%s", log.String())
		}
	})
	base := "http://" + addr
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if resp, err := http.Get(base + "/healthz"); err == nil {
			resp.Body.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the demo did not start within 30 s")
		}
	}

	out := filepath.Join(t.TempDir(), "demo")
	var stdout bytes.Buffer
	// With a room the crowd buys at the room's pace, and an admitted
	// person presses when told: three seconds at 40 admitted a second
	// sell the 20 units with room to spare on a loaded runner (at 20 a
	// second within 1.5 s, one unit was once left held).
	args := []string{"-base", base, "-out", out, "-room", "both", "-users", "80", "-bots", "4", "-stock", "20",
		"-lead", "500ms", "-bot-lead", "300ms", "-duration", "3s", "-settle", "0", "-timeout", "20s", "-room-rate", "40", "-room-hold", "5s"}
	if err := run(t.Context(), args, &stdout, &stdout); err != nil {
		t.Fatalf("%v\n%s", err, stdout.String())
	}
	t.Logf("%s", stdout.String())
	for _, name := range []string{"-without-room", "-with-room"} {
		r, err := load(out + name + ".json")
		if err != nil {
			t.Fatal(err)
		}
		an := analyse(r, 0, 0)
		for check, v := range verdicts(an) {
			if v != pass {
				t.Errorf("%s: %s is %s", name, check, v)
			}
		}
		if an.Wins != 20 {
			t.Errorf("%s: %d orders, want 20", name, an.Wins)
		}
		if (an.Room != nil) != (name == "-with-room") || (an.Room != nil && an.Room.Admitted == 0) {
			t.Errorf("%s: room figures %+v", name, an.Room)
		}
	}
}
