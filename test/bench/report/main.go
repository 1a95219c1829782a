// Command report renders a benchmark results file of test/bench (JSON,
// written by `make bench`) as the Markdown tables of docs/performance.md:
//
//	go run ./test/bench/report [FILE.json]
//
// Without FILE it renders the newest file in bench-results/.
package main

import (
	"fmt"
	"os"

	"github.com/corralhq/corral/test/bench/results"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "report:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	var path string
	switch len(args) {
	case 0:
		p, err := results.Latest("bench-results")
		if err != nil {
			return err
		}
		path = p
	case 1:
		path = args[0]
	default:
		return fmt.Errorf("usage: report [FILE.json]")
	}
	r, err := results.Read(path)
	if err != nil {
		return err
	}
	r.Markdown(os.Stdout)
	return nil
}
