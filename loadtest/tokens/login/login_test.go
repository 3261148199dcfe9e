package login

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"
)

// TestAll logs 50 users in, 8 at once, on a server that refuses every
// other login 429 (its cap on logins in flight from one address): each
// comes back and logs in, with the user ID and token of its own phone.
func TestAll(t *testing.T) {
	var logins atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var in struct{ Phone string }
		json.NewDecoder(r.Body).Decode(&in)
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case "/auth/code":
			w.Write([]byte(`{"sent": true, "code": "123456"}`))
		case "/auth/login":
			if logins.Add(1)%2 == 0 {
				w.Header().Set("Retry-After", "0")
				w.WriteHeader(http.StatusTooManyRequests)
				w.Write([]byte(`{"error": {"code": "busy", "message": "busy"}}`))
				return
			}
			id := in.Phone[len(in.Phone)-3:]
			json.NewEncoder(w).Encode(map[string]any{"token": "tok-" + id, "user": map[string]string{"id": id}})
		}
	}))
	defer srv.Close()
	var done atomic.Int32
	as, err := All(t.Context(), srv.Client(), []string{srv.URL}, 15000000100, 50, 8, func(int, Account) error {
		done.Add(1)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for i, a := range as {
		if id := strconv.Itoa(100 + i); a.ID != id || a.Token != "tok-"+id {
			t.Errorf("user %d: %+v", i, a)
		}
	}
	if done.Load() != 50 {
		t.Errorf("done called %d times, want 50", done.Load())
	}
}

// TestAllStopsAtTheFirstCodeNotAnswered: against a server that answers
// no login code (a real SMS gateway behind it), the logins stop after
// one code: not one per worker sent to strangers' phones.
func TestAllStopsAtTheFirstCodeNotAnswered(t *testing.T) {
	var codes atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/auth/code" {
			codes.Add(1)
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"sent": true}`))
	}))
	defer srv.Close()
	if _, err := All(t.Context(), srv.Client(), []string{srv.URL}, 15500000000, 100, 16, nil); !errors.Is(err, ErrNoCode) {
		t.Fatalf("logins through a server that answers no code: %v, want ErrNoCode", err)
	}
	if n := codes.Load(); n != 1 {
		t.Errorf("%d login codes asked for, want 1", n)
	}
}
