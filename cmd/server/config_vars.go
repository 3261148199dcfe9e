package main

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// vars reads the environment for loadConfig. Each of its readers (str,
// int, dur, bool, list, ...) reads one variable, without the spaces
// around it and with a default when that leaves nothing, and collects
// what is wrong in errs instead of stopping at the first mistake: one run
// reports them all.
type vars struct {
	getenv func(string) string
	errs   []error
}

// add collects err, if there is one.
func (v *vars) add(err error) {
	if err != nil {
		v.errs = append(v.errs, err)
	}
}

// errorf collects an error formatted as fmt.Errorf does.
func (v *vars) errorf(format string, args ...any) {
	v.errs = append(v.errs, fmt.Errorf(format, args...))
}

// str reads a string: the variable without the spaces around it, or def
// if that leaves nothing.
func (v *vars) str(name, def string) string {
	if s := strings.TrimSpace(v.getenv(name)); s != "" {
		return s
	}
	return def
}

// int reads an integer from lo to hi.
func (v *vars) int(name string, def, lo, hi int) int {
	n, err := strconv.Atoi(v.str(name, strconv.Itoa(def)))
	if err != nil || n < lo || n > hi {
		v.errorf("%s must be an integer from %d to %d", name, lo, hi)
	}
	return n
}

// limit reads a limit: a count from 0 (no limit) to maxLimit.
func (v *vars) limit(name string, def int) int {
	n, err := strconv.Atoi(v.str(name, strconv.Itoa(def)))
	if err != nil || n < 0 || n > maxLimit {
		v.errorf("%s must be an integer from 0 (no limit) to %d", name, maxLimit)
	}
	return n
}

// dur reads a positive duration.
func (v *vars) dur(name string, def time.Duration) time.Duration {
	d, err := time.ParseDuration(v.str(name, def.String()))
	if err != nil || d <= 0 {
		v.errorf("%s must be a positive duration such as %s", name, def)
	}
	return d
}

// offOrSeconds reads a duration that 0 turns off, or else of a second or
// more.
func (v *vars) offOrSeconds(name string, def time.Duration) time.Duration {
	d, err := time.ParseDuration(v.str(name, def.String()))
	if err != nil || (d != 0 && d < time.Second) {
		// Retry-After counts whole seconds: a shorter window could
		// only be announced as one second anyway.
		v.errorf("%s must be 0 (off) or a duration of at least 1s such as %s", name, def)
	}
	return d
}

// rate reads a rate: a number of requests a second, 0 or more.
func (v *vars) rate(name string, def float64) float64 {
	s := strconv.FormatFloat(def, 'g', -1, 64)
	f, err := strconv.ParseFloat(v.str(name, s), 64)
	if err != nil || math.IsNaN(f) || f < 0 || f > 1e9 {
		v.errorf("%s must be a number of requests a second, 0 (off) or more, such as %s", name, s)
		return 0
	}
	return f
}

// bool reads a switch: true or 1 turn it on, anything else off.
func (v *vars) bool(name string, def bool) bool {
	s := v.str(name, strconv.FormatBool(def))
	return s == "true" || s == "1"
}

// list reads a comma-separated list, without the spaces around its items
// or the empty ones.
func (v *vars) list(name, def string) []string {
	var out []string
	for _, p := range strings.Split(v.str(name, def), ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
