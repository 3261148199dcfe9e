package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// TestLinks follows every relative link of README.md and docs/*.md: the
// file it names must exist and, when it has an #anchor and names a
// Markdown file (or the page itself), a heading of that file must have
// that anchor as GitHub makes it. Links to the web are not followed.
func TestLinks(t *testing.T) {
	pages, err := filepath.Glob("*.md")
	if err != nil {
		t.Fatal(err)
	}
	pages = append([]string{"../README.md"}, pages...)
	anchors := map[string]map[string]bool{} // by cleaned path
	anchorsOf := func(path string) (map[string]bool, error) {
		if a, ok := anchors[path]; ok {
			return a, nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		a := headingAnchors(string(b))
		anchors[path] = a
		return a, nil
	}
	links := 0
	for _, page := range pages {
		b, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range pageLinks(string(b)) {
			target, anchor, _ := strings.Cut(l.target, "#")
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			links++
			path := filepath.Clean(page)
			if target != "" {
				path = filepath.Join(filepath.Dir(page), target)
				if _, err := os.Stat(path); err != nil {
					t.Errorf("%s:%d: link to %s: no such file", page, l.line, l.target)
					continue
				}
			}
			if anchor == "" || !strings.HasSuffix(path, ".md") {
				continue
			}
			a, err := anchorsOf(path)
			if err != nil {
				t.Errorf("%s:%d: %v", page, l.line, err)
				continue
			}
			if !a[anchor] {
				t.Errorf("%s:%d: link to %s: %s has no heading with the anchor #%s", page, l.line, l.target, path, anchor)
			}
		}
	}
	if links < 50 {
		t.Errorf("only %d relative links found: is the link pattern still right?", links)
	}
}

// TestHeadingAnchors pins the anchor rules to examples GitHub renders.
func TestHeadingAnchors(t *testing.T) {
	for heading, want := range map[string]string{
		"## Logging in: login codes and their limits":                  "logging-in-login-codes-and-their-limits",
		"### `POST /seckill/{voucherId}`":                              "post-seckillvoucherid",
		"### 1. `oversell`: check the stock, then decrement":           "1-oversell-check-the-stock-then-decrement",
		"## Why not a `sync.Mutex`?":                                   "why-not-a-syncmutex",
		"## The course, chapter by chapter (一人一单, 超卖)":                 "the-course-chapter-by-chapter-一人一单-超卖",
		"## `AUTH_FREE_GUESSES` and [a link](x.md)":                    "auth_free_guesses-and-a-link",
		"## What a `200` promises":                                     "what-a-200-promises",
		"### 12b. `redlock-restart`: a RedLock server restarted empty": "12b-redlock-restart-a-redlock-server-restarted-empty",
	} {
		got := headingAnchors(heading + "\n")
		if !got[want] || len(got) != 1 {
			t.Errorf("%q: anchors %v, want %q", heading, got, want)
		}
	}
	got := headingAnchors("# A\n## A\n```\n# not a heading\n```\n## A\n")
	for _, want := range []string{"a", "a-1", "a-2"} {
		if !got[want] {
			t.Errorf("repeated headings: %v, want %s among them", got, want)
		}
	}
	if got["not-a-heading"] {
		t.Error("a line in a code block was taken for a heading")
	}
}

type link struct {
	line   int
	target string
}

var (
	inlineLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	codeSpan   = regexp.MustCompile("`[^`]*`")
	mdLink     = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`)
)

// pageLinks returns the targets of a page's inline links, outside code
// blocks and code spans.
func pageLinks(doc string) []link {
	var out []link
	fenced := false
	for i, line := range strings.Split(doc, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			continue
		}
		if fenced {
			continue
		}
		line = codeSpan.ReplaceAllString(line, "")
		for _, m := range inlineLink.FindAllStringSubmatch(line, -1) {
			out = append(out, link{i + 1, m[1]})
		}
	}
	return out
}

// headingAnchors returns the anchors GitHub gives a page's headings: the
// heading's text, links reduced to their text, in lower case, without
// the characters that are neither letters, digits, spaces, hyphens nor
// underscores, spaces turned into hyphens; a repeated anchor gets -1, -2,
// ... in order.
func headingAnchors(doc string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	fenced := false
	for _, line := range strings.Split(doc, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			continue
		}
		if fenced || !strings.HasPrefix(line, "#") {
			continue
		}
		text := strings.TrimLeft(line, "#")
		if len(text) == len(line) || len(line)-len(text) > 6 || !strings.HasPrefix(text, " ") {
			continue
		}
		text = mdLink.ReplaceAllString(strings.TrimSpace(text), "$1")
		var b strings.Builder
		for _, r := range strings.ToLower(text) {
			switch {
			case r == ' ':
				b.WriteByte('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.Is(unicode.Mn, r):
				b.WriteRune(r)
			}
		}
		a := b.String()
		if n, ok := seen[a]; ok {
			seen[a] = n + 1
			a += "-" + strconv.Itoa(n+1)
		} else {
			seen[a] = 0
		}
		out[a] = true
	}
	return out
}

// TestCICommandIsREADMEs holds .ci/run to README.md's test command: the
// lines of the README's block that runs go test -race on ./... appear in .ci/run,
// word for word and in order, as .ci/run says they do.
func TestCICommandIsREADMEs(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	ci, err := os.ReadFile("../.ci/run")
	if err != nil {
		t.Fatal(err)
	}
	var block []string
	for _, b := range strings.Split(string(readme), "```sh\n")[1:] {
		b, _, _ = strings.Cut(b, "```")
		if strings.Contains(b, "go test -race") && strings.HasSuffix(strings.TrimSpace(b), " ./...") {
			block = strings.Split(strings.TrimSpace(b), "\n")
			break
		}
	}
	if block == nil {
		t.Fatal("README.md has no ```sh block with go test -race ... ./...")
	}
	// Whole lines, comments left out: a line commented out in .ci/run, or
	// one that only ends like the README's, does not count.
	var lines []string
	for _, l := range strings.Split(string(ci), "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			lines = append(lines, l)
		}
	}
	for _, l := range block {
		i := slices.Index(lines, l)
		if i < 0 {
			t.Fatalf(".ci/run lacks README.md's test command line %q (or has it out of order, or commented out)", l)
		}
		lines = lines[i+1:]
	}
}
