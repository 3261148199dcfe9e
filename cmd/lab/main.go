// Command lab runs each classic mistake of a flash-sale backend for real,
// next to its fix, and shows the damage in numbers.
//
// Articles on seckill systems and Redis locks warn about oversold stock,
// duplicate orders, locks held forever and locks held twice. Demos of
// those failures usually "may not reproduce": they fire a thousand
// goroutines and hope the scheduler interleaves them badly. The lab does
// not hope. Each broken variant has a hook at the exact point where its
// guard is missing (between the check and the act, between SETNX and
// EXPIRE, between GET and DEL, past the ttl), and the lab holds it there
// while the rest of the world moves on. Every run shows the damage; the
// fixed variant runs the same load through the same pause and shows none.
//
// The lab needs no server: Redis is miniredis, in process, whose clock the
// lab moves by hand to expire keys exactly when it wants, and the database
// is SQLite in memory. The two experiments about servers that fail
// (failover, redlock-restart) start real redis-server processes of their
// own, and are skipped, with a line saying so, where redis-server is not
// installed.
//
// Usage:
//
//	go run ./cmd/lab            # every experiment, a block each
//	go run ./cmd/lab NAME...    # only these
//	go run ./cmd/lab -list      # numbers, names and titles
//	go run ./cmd/lab -json      # the results as JSON
//	go run ./cmd/lab -svg DIR   # and a timeline of each lock experiment
//
// It exits non-zero if a broken variant showed no damage or a fixed one
// showed some: the lab itself then has a bug. docs/lab.md tells each
// experiment's story.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"text/tabwriter"
	"unicode/utf8"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "lab:", err)
		stop()
		os.Exit(1)
	}
}

// run parses the command line, runs the chosen experiments and prints them.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("lab", flag.ContinueOnError)
	fs.SetOutput(stderr)
	list := fs.Bool("list", false, "list the experiments and exit")
	asJSON := fs.Bool("json", false, "print the results as JSON")
	svgDir := fs.String("svg", "", "write a timeline of each lock experiment, `DIR`/<name>.svg")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: lab [-list] [-json] [-svg DIR] [NAME...]")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); errors.Is(err, flag.ErrHelp) {
		return nil // -h: the usage is all that was asked for
	} else if err != nil {
		return err
	}

	chosen, err := choose(fs.Args())
	if err != nil {
		return err
	}
	if *list {
		// The numbers are the lab's, not the places in this list: "lab
		// -list failover" still says 12.
		num := numbers()
		tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
		for _, e := range chosen {
			fmt.Fprintf(tw, "%s\t%s\t%s\n", num[e.name], e.name, e.title)
		}
		return tw.Flush()
	}

	var reports []report
	for _, e := range chosen {
		r, err := runExperiment(ctx, e)
		if errors.Is(err, errNoRedisServer) {
			// The experiments that need a real server say so and make
			// way for the rest.
			fmt.Fprintf(stderr, "lab: experiment %s skipped: %v\n", e.name, err)
			continue
		}
		if err != nil {
			return fmt.Errorf("experiment %s: %w", e.name, err)
		}
		reports = append(reports, r)
	}

	if *svgDir != "" {
		if err := writeSVGs(*svgDir, reports); err != nil {
			return err
		}
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		enc.SetEscapeHTML(false) // lessons quote SQL: keep "stock > 0" readable
		if err := enc.Encode(reports); err != nil {
			return err
		}
	} else if err := printReport(stdout, reports); err != nil {
		return err
	}
	return check(reports)
}

// choose returns the experiments named, in the lab's order, or all of them.
func choose(names []string) ([]experiment, error) {
	if len(names) == 0 {
		return experiments, nil
	}
	want := make(map[string]bool)
	for _, n := range names {
		want[n] = true
	}
	var chosen []experiment
	for _, e := range experiments {
		if want[e.name] {
			chosen = append(chosen, e)
			delete(want, e.name)
		}
	}
	if len(want) > 0 {
		var unknown, known []string
		for n := range want {
			unknown = append(unknown, n)
		}
		for _, e := range experiments {
			known = append(known, e.name)
		}
		return nil, fmt.Errorf("no experiment named %s (try one of: %s)",
			strings.Join(unknown, ", "), strings.Join(known, " "))
	}
	return chosen, nil
}

// reportWidth is the widest line printReport writes: it fits an
// 80-column terminal, with room to spare in a wider one.
const reportWidth = 80

// printReport writes one block per experiment: its number, name and
// title, then the broken variant's damage, the fixed one's result and the
// lesson, each wrapped to reportWidth. (A table with a column each was
// 330 characters wide: a reader scrolled sideways to find the lesson.)
//
//  7. del-after-expiry: plain DEL after the lock expired
//     broken  1 overlap: A deleted B's lock; C got it while B held it
//     fixed   0 overlaps: A's release left B's lock alone; C refused
//     lesson  delete only your own lock: a random token, compared and
//     deleted in one script
func printReport(w io.Writer, reports []report) error {
	var b strings.Builder
	for i, r := range reports {
		if i > 0 {
			b.WriteString("\n")
		}
		// Every block is indented alike, "1." and "12b." included.
		head := fmt.Sprintf("%-5s", r.Number+".")
		indent := strings.Repeat(" ", len(head))
		writeWrapped(&b, head, indent, r.Name+": "+r.Title)
		for _, row := range [][2]string{
			{"broken  ", plural(r.Broken.violations, r.Counts) + ": " + r.Broken.summary},
			{"fixed   ", plural(r.Fixed.violations, r.Counts) + ": " + r.Fixed.summary},
			{"lesson  ", r.Lesson},
		} {
			writeWrapped(&b, indent+row[0], strings.Repeat(" ", len(indent+row[0])), row[1])
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// writeWrapped writes text after first, broken at spaces into lines of at
// most reportWidth characters, the lines after the first after indent.
func writeWrapped(b *strings.Builder, first, indent, text string) {
	line, n := first, utf8.RuneCountInString(first)
	empty := true // nothing of text on this line yet
	for _, word := range strings.Fields(text) {
		wn := utf8.RuneCountInString(word)
		if !empty && n+1+wn > reportWidth {
			b.WriteString(line + "\n")
			line, n, empty = indent, utf8.RuneCountInString(indent), true
		}
		if !empty {
			line, n = line+" ", n+1
		}
		// A word longer than a line stays whole: a broken SQL keyword
		// is worse than a long line.
		line, n, empty = line+word, n+wn, false
	}
	b.WriteString(line + "\n")
}

// check fails the run if an experiment did not show what it exists to
// show: that would be a bug of the lab, not a finding.
func check(reports []report) error {
	var errs []error
	for _, r := range reports {
		if r.Broken.violations == 0 {
			errs = append(errs, fmt.Errorf("experiment %s: the broken variant showed no damage", r.Name))
		}
		if r.Fixed.violations != 0 {
			errs = append(errs, fmt.Errorf("experiment %s: the fixed variant showed %d violations", r.Name, r.Fixed.violations))
		}
	}
	return errors.Join(errs...)
}
