// Command roomcheck recomputes a waiting room's draw from its seed and the
// users who joined before begin_time, so that anyone can check the numbers
// the room gave (package room, "The draw").
//
//	go run ./cmd/roomcheck -seed <hex> [-commitment <hex>] 17 42 99 ...
//	... | go run ./cmd/roomcheck -seed <hex>       (user IDs on stdin)
//
// It prints one line per user, "<number> <user ID>", in number order, and
// with -commitment checks first that the seed is the one committed to when
// the voucher was made (its SHA-256), failing if it is not.
package main

import (
	"bufio"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"seckill/internal/room"
)

func main() {
	if err := run(os.Args[1:], os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "roomcheck:", err)
		os.Exit(1)
	}
}

func run(args []string, stdin io.Reader, stdout io.Writer) error {
	fs := flag.NewFlagSet("roomcheck", flag.ContinueOnError)
	seedHex := fs.String("seed", "", "the room's seed, as the voucher's room.seed gives it (hex)")
	commitment := fs.String("commitment", "", "the room's commitment, as published before the draw (hex); checked against the seed")
	if err := fs.Parse(args); err != nil {
		return err
	}
	seed, err := hex.DecodeString(*seedHex)
	if err != nil || len(seed) != room.SeedSize {
		return fmt.Errorf("-seed must be %d bytes in hex", room.SeedSize)
	}
	if *commitment != "" && !strings.EqualFold(*commitment, room.Commitment(seed)) {
		return errors.New("the seed does not match the commitment: it is not the seed committed to before anyone joined")
	}
	words := fs.Args()
	if len(words) == 0 {
		sc := bufio.NewScanner(stdin)
		for sc.Scan() {
			words = append(words, strings.Fields(sc.Text())...)
		}
		if err := sc.Err(); err != nil {
			return err
		}
	}
	users := make([]int64, 0, len(words))
	seen := map[int64]bool{}
	for _, w := range words {
		id, err := strconv.ParseInt(w, 10, 64)
		if err != nil || id <= 0 {
			return fmt.Errorf("%q is not a user ID", w)
		}
		if seen[id] {
			return fmt.Errorf("user %d is listed twice: a user has one place", id)
		}
		seen[id] = true
		users = append(users, id)
	}
	w := bufio.NewWriter(stdout)
	for i, u := range room.Draw(seed, users) {
		fmt.Fprintf(w, "%d %d\n", i+1, u)
	}
	return w.Flush()
}
