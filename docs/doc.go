// Package docs holds the project's documentation, README.md's manual
// pages, and no code. Its test checks that every relative link of
// README.md and docs/*.md leads somewhere: the file exists, and an
// #anchor names a heading of the page it points into, by GitHub's rules.
package docs
