package main

import (
	"strings"
	"testing"
	"time"
)

// TestRoomSale: the crowd goes through a waiting room (the fake's) and
// every check passes; the report shows the line, the units held, and the
// joins' answers and latency as joins, apart from the presses.
func TestRoomSale(t *testing.T) {
	t.Parallel()
	r, an, err := rehearseAgainst(t, newFakeServer(t, nil), "-room", "on", "-room-rate", "40", "-room-hold", "5s", "-late", "0")
	if err != nil {
		t.Errorf("run: %v", err)
	}
	for name, v := range verdicts(an) {
		if v != pass {
			t.Errorf("%s: %s", name, v)
		}
	}
	if an.Room == nil || an.Room.Admitted == 0 || an.Room.PeakHeld == 0 {
		t.Fatalf("room figures %+v: want buyers admitted and units held", an.Room)
	}
	if an.Totals["join: in line"] != len(r.Users) {
		t.Errorf("%d joins answered 200, want one per user (%d); totals %v", an.Totals["join: in line"], len(r.Users), an.Totals)
	}
	if an.Joins.N != len(r.Users) || an.OK.N != an.Wins {
		t.Errorf("latency: %d joins, %d presses answered 200; want %d, %d", an.Joins.N, an.OK.N, len(r.Users), an.Wins)
	}
	page := reportOf(t, r)
	for _, id := range []string{"room-waiting", "room-admitted", "room-held", "latency-joins"} {
		if !strings.Contains(page, `data-chart="`+id+`"`) {
			t.Errorf("chart %s missing", id)
		}
	}
}

// TestRoomJoinsRetried: the room answers each user's first join 503
// with Retry-After: 1. Every user (each turns up before the start) tries
// again, and is in the line.
func TestRoomJoinsRetried(t *testing.T) {
	t.Parallel()
	r, an, _ := rehearseAgainst(t, newFakeServer(t, func(f *fakeServer) { f.joinFlaky = 1 }), "-room", "on", "-room-rate", "100", "-late", "0")
	for u := range r.Users {
		var joins []Attempt
		for _, a := range attemptsOf(r, u) {
			if a.Kind == "join" {
				joins = append(joins, a)
			}
		}
		if len(joins) != 2 || joins[0].Status != 503 || joins[1].Status != 200 || joins[1].Try != 1 {
			t.Errorf("user %d joined %+v; want a 503, then a 200 on the second try", u, joins)
			continue
		}
		if r.Users[u].Honours && joins[1].Due < joins[0].Done+time.Second {
			t.Errorf("user %d honours Retry-After, but joined again %s after the 503", u, joins[1].Due-joins[0].Done)
		}
		if !r.Room.Users[u].In {
			t.Errorf("user %d is not in the line", u)
		}
	}
	if an.Wins == 0 {
		t.Error("nobody bought")
	}
}

// TestJoinsAreNotPresses: a join's answers are counted and drawn as
// joins: a join answered 200 is no sale, a join refused sold_out is not
// the buy button's first sold_out, and neither is in the presses'
// latency.
func TestJoinsAreNotPresses(t *testing.T) {
	r := &Run{Voucher: Voucher{Stock: 1, Room: true}, Users: []User{{ID: "1", Kind: person}, {ID: "2", Kind: person}},
		Room: &RoomLine{Users: []RoomUser{{User: 0, In: true, Admitted: 100 * time.Millisecond, HoldUntil: 5 * time.Second}, {User: 1, Admitted: -1}}},
		Attempts: []Attempt{
			{User: 0, Kind: "join", Due: -time.Second, Sent: -time.Second, Done: -time.Second + 5*time.Millisecond, Status: 200, Code: codeOK},
			{User: 1, Kind: "join", Due: 50 * time.Millisecond, Sent: 50 * time.Millisecond, Done: 60 * time.Millisecond, Status: 409, Code: "sold_out"},
			{User: 0, Due: 300 * time.Millisecond, Sent: 300 * time.Millisecond, Done: 310 * time.Millisecond, Status: 200, Code: codeOK, Order: "9"},
		}}
	an := analyse(r, 100*time.Millisecond, 0)
	if an.Totals["join: in line"] != 1 || an.Totals["join: refused (409)"] != 1 || an.Totals["200"] != 1 || an.Totals["409 sold_out"] != 0 {
		t.Errorf("totals %v", an.Totals)
	}
	if an.OK.N != 1 || an.Refused.N != 0 || an.Joins.N != 2 {
		t.Errorf("latency counted %d 200s, %d refusals, %d joins; want 1, 0, 2", an.OK.N, an.Refused.N, an.Joins.N)
	}
	if an.SoldOut != nil {
		t.Errorf("first sold_out at %s: a join's refusal taken for the buy button's", *an.SoldOut)
	}
	for _, c := range charts(r, an, nil) {
		for _, s := range c.Series {
			if c.ID == "answers" && strings.Contains(s.Name, "join") != strings.HasPrefix(s.Name, "join:") {
				t.Errorf("answers chart: series %q", s.Name)
			}
		}
	}
}

// TestRoomHeldUnits: a unit is held from its buyer's admission until
// their order, or until their hold ends.
func TestRoomHeldUnits(t *testing.T) {
	r := &Run{Voucher: Voucher{Stock: 2, Room: true}, Users: []User{{ID: "1"}, {ID: "2"}},
		Room: &RoomLine{Users: []RoomUser{
			{User: 0, In: true, Joined: -time.Second, Admitted: 50 * time.Millisecond, HoldUntil: 10 * time.Second}, // buys at 0.35 s
			{User: 1, In: true, Joined: -time.Second, Admitted: 150 * time.Millisecond, HoldUntil: 650 * time.Millisecond},
		}},
		Attempts: []Attempt{
			{User: 0, Due: 300 * time.Millisecond, Sent: 300 * time.Millisecond, Done: 350 * time.Millisecond, Status: 200, Code: codeOK, Order: "9"},
			{User: 1, Due: 800 * time.Millisecond, Sent: 800 * time.Millisecond, Done: 810 * time.Millisecond, Status: 409, Code: "not_admitted"},
		}}
	r.Users[0].Arrive, r.Users[1].Arrive = -time.Second, -time.Second
	f := analyse(r, 100*time.Millisecond, 0).Room
	// Bins from -1 s; at each bin's end: 0.1 s: user 0; 0.2 s and 0.3 s:
	// both; 0.4 s to 0.6 s: user 1; then none.
	want := map[time.Duration]int{0: 1, 100 * time.Millisecond: 2, 200 * time.Millisecond: 2, 300 * time.Millisecond: 1, 400 * time.Millisecond: 1, 500 * time.Millisecond: 1, 600 * time.Millisecond: 0, 700 * time.Millisecond: 0}
	for i, h := range f.Held {
		at := f.From + time.Duration(i)*f.Bin
		if w, ok := want[at]; ok && h != w {
			t.Errorf("bin at %s: %d held, want %d", at, h, w)
		}
	}
	if f.PeakHeld != 2 {
		t.Errorf("peak held %d, want 2", f.PeakHeld)
	}
}

// reportOf writes r's report and returns it.
func reportOf(t *testing.T, r *Run) string {
	t.Helper()
	var b strings.Builder
	if err := writeReport(&b, r, analyse(r, 0, 0), nil, 0, 0); err != nil {
		t.Fatal(err)
	}
	return b.String()
}
