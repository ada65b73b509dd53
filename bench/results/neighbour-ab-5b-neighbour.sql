SELECT count(*) FROM bench_neighbour WHERE pad LIKE '%abc%';
