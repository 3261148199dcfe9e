// Package room is a voucher's waiting room: the line in front of the buy
// button, kept in Redis beside the voucher's stock.
//
// Without a room, a hot voucher goes to whoever presses fastest and
// retries best: a script that polls every 10 ms beats a person who was
// there first. With one, buyers join the line (POST /vouchers/{id}/room),
// are given numbers, and are admitted in number order, at the voucher's
// rate (admit_per_second), and never more at once than there are units
// left. An admitted buyer holds a unit for hold_for: POST /seckill sells
// to admitted buyers only (not_admitted to everyone else), and never tells
// one of them sold_out while the hold lasts.
//
// # The draw
//
// Everyone who joins before begin_time is numbered at begin_time, in the
// ascending byte order of HMAC-SHA256(seed, user ID). The seed is 32 random
// bytes the server chose when the voucher was created; its SHA-256, the
// commitment, is published from creation on, and the seed itself from
// begin_time on. So no one, not the buyers and not the operator once
// anyone has joined, can choose the order, and anyone given the list of
// who joined before begin_time can check it afterwards: Draw recomputes
// every number from the seed and the user IDs (go run ./cmd/roomcheck). Who joins from begin_time on is numbered after
// everyone drawn, in the order their joins were recorded.
//
// # One script for each decision
//
// The line lives in Redis, in the voucher's slot (its keys share the hash
// tag of its stock keys), so that every instance serves the same line and
// one script can count the stock while it decides:
//
//   - join.lua gives a place, or the place already held, once per user;
//   - admit.lua admits the next numbers: at the rate (a token bucket in the
//     room's state), in number order, and only while a unit is free (the
//     stock minus the holds that have not ended). Every instance calls it
//     a few times a second (Admitter): whichever calls, the bound holds;
//   - package stock's take.lua (sync mode) and package queue's accept.lua
//     (async mode) sell a unit only to a user whose hold has not ended,
//     in the same script that takes the unit, and the order ends the hold.
//
// Checked in two steps instead (is there stock? then admit), two instances
// admitting at once could each see the last free unit, and hold it twice;
// the lab's "room" experiment shows it.
//
// A voucher with a room is never split into buckets: its line and its
// stock must share one slot.
package room

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strconv"
	"time"

	"seckill/internal/apperr"
)

// Bounds and defaults of a room's settings, as the contract gives them.
const (
	MaxAdmitPerSecond = 100_000
	MinHoldFor        = 5 * time.Second
	MaxHoldFor        = time.Hour
	DefaultHoldFor    = 60 * time.Second
	SeedSize          = 32
)

// Config is a voucher's room, as its creator set it.
type Config struct {
	OpensAt        time.Time
	AdmitPerSecond int
	HoldFor        time.Duration
}

// Input is the "room" of POST /vouchers. Pointers tell a missing field
// from a zero one.
type Input struct {
	OpensAt        *time.Time `json:"opens_at"`
	AdmitPerSecond *int       `json:"admit_per_second"`
	HoldFor        *int       `json:"hold_for"` // seconds
}

// Config checks in and returns the room it asks for, on a voucher created
// at created whose sale begins at begin. opens_at defaults to created, or
// begin if that is earlier.
func (in Input) Config(created, begin time.Time) (Config, error) {
	c := Config{HoldFor: DefaultHoldFor, OpensAt: created}
	if begin.Before(created) {
		c.OpensAt = begin
	}
	switch {
	case in.AdmitPerSecond == nil:
		return Config{}, apperr.Invalid("room.admit_per_second is required")
	case *in.AdmitPerSecond < 1 || *in.AdmitPerSecond > MaxAdmitPerSecond:
		return Config{}, apperr.Invalid(fmt.Sprintf("room.admit_per_second must be between 1 and %d", MaxAdmitPerSecond))
	case in.HoldFor != nil && (*in.HoldFor < int(MinHoldFor/time.Second) || *in.HoldFor > int(MaxHoldFor/time.Second)):
		return Config{}, apperr.Invalid(fmt.Sprintf("room.hold_for must be between %d and %d seconds", int(MinHoldFor/time.Second), int(MaxHoldFor/time.Second)))
	case in.OpensAt != nil && in.OpensAt.After(begin):
		return Config{}, apperr.Invalid("room.opens_at must be at or before begin_time")
	}
	c.AdmitPerSecond = *in.AdmitPerSecond
	if in.HoldFor != nil {
		c.HoldFor = time.Duration(*in.HoldFor) * time.Second
	}
	if in.OpensAt != nil {
		c.OpensAt = in.OpensAt.UTC().Truncate(time.Millisecond)
	}
	return c, nil
}

// Sale is what the room needs of its voucher.
type Sale struct {
	VoucherID  int64
	Begin, End time.Time
	Stock      int64 // the initial stock, for the figures
	Config
	Seed []byte // SeedSize bytes
}

// Commitment is the lower-case hex SHA-256 of seed: published from the
// voucher's creation on, so that the seed, revealed at begin_time, can be
// checked to be the one chosen before anyone joined.
func Commitment(seed []byte) string {
	sum := sha256.Sum256(seed)
	return hex.EncodeToString(sum[:])
}

// Key is what orders user in the draw: HMAC-SHA256, keyed with the seed,
// of the user ID in decimal ASCII, as lower-case hex (whose order is the
// bytes' order).
func Key(seed []byte, userID int64) string {
	m := hmac.New(sha256.New, seed)
	m.Write([]byte(strconv.FormatInt(userID, 10)))
	return hex.EncodeToString(m.Sum(nil))
}

// Draw numbers the users who joined before begin_time, as the room did:
// the returned slice holds them in number order (number i+1 at index i),
// by the ascending order of Key. It is the verifier of the draw: anyone
// with the seed (revealed at begin_time) and the list of users recomputes
// every number.
func Draw(seed []byte, users []int64) []int64 {
	type drawn struct {
		key  string
		user int64
	}
	ds := make([]drawn, len(users))
	for i, u := range users {
		ds[i] = drawn{Key(seed, u), u}
	}
	slices.SortFunc(ds, func(a, b drawn) int {
		if a.key < b.key {
			return -1
		}
		if a.key > b.key {
			return 1
		}
		return 0
	})
	out := make([]int64, len(ds))
	for i, d := range ds {
		out[i] = d.user
	}
	return out
}
