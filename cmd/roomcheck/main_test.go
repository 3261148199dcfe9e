package main

import (
	"strings"
	"testing"
)

// The command prints the draw of the frozen vectors of package room, and
// refuses a seed that does not match its commitment.
func TestRoomcheck(t *testing.T) {
	const seed = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f"
	const commitment = "630dcd2966c4336691125448bbb25b4ff412a49c732db2c8abc1b8581bd710dd"
	var out strings.Builder
	err := run([]string{"-seed", seed, "-commitment", commitment}, strings.NewReader("1 2 3 4 5 6\n7 8 9 10 11 12 271846193284534273\n"), &out)
	if err != nil {
		t.Fatal(err)
	}
	want := "1 8\n2 3\n3 11\n4 4\n5 7\n6 10\n7 9\n8 1\n9 2\n10 271846193284534273\n11 6\n12 12\n13 5\n"
	if out.String() != want {
		t.Errorf("got\n%s\nwant\n%s", out.String(), want)
	}
	for _, args := range [][]string{
		{"-seed", seed, "-commitment", strings.Repeat("0", 64), "1"},
		{"-seed", "abc", "1"},
		{"-seed", seed, "1", "1"},
		{"-seed", seed, "x"},
	} {
		if err := run(args, strings.NewReader(""), &strings.Builder{}); err == nil {
			t.Errorf("%v: no error", args)
		}
	}
}
