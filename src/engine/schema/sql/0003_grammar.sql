-- The statement grammar: tokenizer, parser and renderer (being written).
SELECT 1;
